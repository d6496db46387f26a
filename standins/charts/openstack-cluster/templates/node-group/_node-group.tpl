{{- /* The KubeadmConfigTemplate spec of a node group. Argument: (list $ctx nodeGroup) */}}
{{- define "openstack-cluster.nodeGroup.kubeadmConfigTemplateSpec" -}}
{{- $ctx := index . 0 -}}
{{- $nodeGroup := index . 1 -}}
{{- $base := dict "joinConfiguration" (dict "nodeRegistration" (dict
      "name" "{{ local_hostname }}"
      "kubeletExtraArgs" (dict "cloud-provider" "external")
    ))
-}}
{{- $spec := (include "openstack-cluster.merge" (list $base ($nodeGroup.kubeadmConfigSpec | default dict) true) | fromJson).v -}}
template:
  spec: {{ toYaml $spec | nindent 4 }}
{{- end -}}

{{/* Hashed like the machine templates: KubeadmConfigTemplates are replaced, not edited. */}}
{{- define "openstack-cluster.nodeGroup.kubeadmConfigTemplateName" -}}
{{- $spec := include "openstack-cluster.nodeGroup.kubeadmConfigTemplateSpec" . -}}
{{- $baseName := include "openstack-cluster.componentName" (list (index . 0) (index . 1).name) -}}
{{- printf "%s-%s" ($baseName | trunc 54) (sha256sum $spec | trunc 8) -}}
{{- end -}}
