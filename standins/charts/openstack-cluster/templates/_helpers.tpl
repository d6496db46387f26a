{{/*
Names and labels follow the upstream chart exactly (azimuth-peers reference, section 5.2):
everything capibus selects on is a label written here.
*/}}

{{- define "openstack-cluster.clusterName" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<component>, truncated to a valid object name. Argument: (list $ctx component) */}}
{{- define "openstack-cluster.componentName" -}}
{{- printf "%s-%s" (index . 0).Release.Name (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "openstack-cluster.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "openstack-cluster.commonLabels" -}}
helm.sh/chart: {{ include "openstack-cluster.chart" . }}
{{ .Values.projectPrefix }}/managed-by: {{ .Release.Service }}
{{ .Values.projectPrefix }}/infrastructure-provider: openstack
{{- end -}}

{{- define "openstack-cluster.selectorLabels" -}}
{{ .Values.projectPrefix }}/cluster: {{ include "openstack-cluster.clusterName" . }}
{{- end -}}

{{- define "openstack-cluster.labels" -}}
{{ include "openstack-cluster.commonLabels" . }}
{{ include "openstack-cluster.selectorLabels" . }}
{{- end -}}

{{/* Argument: (list $ctx component) */}}
{{- define "openstack-cluster.componentSelectorLabels" -}}
{{ include "openstack-cluster.selectorLabels" (index . 0) }}
{{ (index . 0).Values.projectPrefix }}/component: {{ index . 1 }}
{{- end -}}

{{/* Argument: (list $ctx component) */}}
{{- define "openstack-cluster.componentLabels" -}}
{{ include "openstack-cluster.commonLabels" (index . 0) }}
{{ include "openstack-cluster.componentSelectorLabels" . }}
{{- end -}}

{{/* Worker selector labels of one node group. Argument: (list $ctx nodeGroupName) */}}
{{- define "openstack-cluster.nodeGroupSelectorLabels" -}}
{{ include "openstack-cluster.componentSelectorLabels" (list (index . 0) "worker") }}
{{ (index . 0).Values.projectPrefix }}/node-group: {{ index . 1 }}
{{- end -}}

{{/* Argument: (list $ctx nodeGroupName) */}}
{{- define "openstack-cluster.nodeGroupLabels" -}}
{{ include "openstack-cluster.commonLabels" (index . 0) }}
{{ include "openstack-cluster.nodeGroupSelectorLabels" . }}
{{- end -}}

{{- define "openstack-cluster.cloudCredentialsSecretName" -}}
{{- .Values.cloudCredentialsSecretName | default (include "openstack-cluster.componentName" (list . "cloud-credentials")) -}}
{{- end -}}

{{/* v<version> with any leading v stripped first. Argument: the version or nil. */}}
{{- define "openstack-cluster.kubernetesVersion" -}}
v{{ . | required "kubernetesVersion is required (top level, controlPlane or node group)" | toString | trimPrefix "v" }}
{{- end -}}

{{/*
Deep merge of two values, the right one winning; maps merge recursively, lists are replaced, or
concatenated when the third argument is true (upstream's mergeConcat for kubeadmConfigSpec).
Unlike sprig's merge, an explicit false/0 on the right wins over a default. Templates can only
return strings, so the result travels as JSON wrapped in {"v": ...}.
Argument: (list left right concatLists)
*/}}
{{- define "openstack-cluster.merge" -}}
{{- $left := index . 0 -}}
{{- $right := index . 1 -}}
{{- $concat := index . 2 -}}
{{- $out := $right -}}
{{- if and (kindIs "map" $left) (kindIs "map" $right) -}}
{{- $out = deepCopy $left -}}
{{- range $key, $value := $right -}}
{{- if hasKey $out $key -}}
{{- $merged := include "openstack-cluster.merge" (list (index $out $key) $value $concat) | fromJson -}}
{{- $_ := set $out $key $merged.v -}}
{{- else -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- else if and $concat (kindIs "slice" $left) (kindIs "slice" $right) -}}
{{- $out = concat $left $right -}}
{{- else if kindIs "invalid" $right -}}
{{- $out = $left -}}
{{- end -}}
{{- dict "v" $out | toJson -}}
{{- end -}}

{{/* A node group entry merged over nodeGroupDefaults, as a map. Argument: (list $ctx entry) */}}
{{- define "openstack-cluster.nodeGroup" -}}
{{- $ctx := index . 0 -}}
{{- $merged := include "openstack-cluster.merge" (list $ctx.Values.nodeGroupDefaults (index . 1) false) | fromJson -}}
{{- toJson $merged.v -}}
{{- end -}}

{{/* Image reference for a machine template spec. Argument: (list $ctx machineSettings) */}}
{{- define "openstack-cluster.machineImage" -}}
{{- $ctx := index . 0 -}}
{{- $machine := index . 1 -}}
{{- $imageId := $machine.machineImageId | default $ctx.Values.machineImageId -}}
{{- $imageName := $machine.machineImage | default $ctx.Values.machineImage -}}
{{- if $imageId -}}
image:
  id: {{ $imageId }}
{{- else -}}
image:
  filter:
    name: {{ tpl ($imageName | required "machineImage or machineImageId is required") $ctx }}
{{- end -}}
{{- end -}}

{{/* The spec of an OpenStackMachineTemplate. Argument: (list $ctx machineSettings) */}}
{{- define "openstack-cluster.machineTemplateSpec" -}}
{{- $ctx := index . 0 -}}
{{- $machine := index . 1 -}}
template:
  spec:
    identityRef:
      name: {{ include "openstack-cluster.cloudCredentialsSecretName" $ctx }}
      cloudName: {{ $ctx.Values.cloudName }}
    flavor: {{ $machine.machineFlavor | required "machineFlavor is required" }}
    {{- include "openstack-cluster.machineImage" . | nindent 4 }}
    {{- with $ctx.Values.machineSSHKeyName }}
    sshKeyName: {{ . }}
    {{- end }}
    {{- with (dig "machineRootVolume" "diskSize" nil $machine) }}
    rootVolume:
      sizeGiB: {{ . }}
    {{- end }}
{{- end -}}

{{/*
Machine templates are immutable, so a changed spec needs a new object: the name carries the
first 8 hex digits of the spec's sha256, as upstream. Argument: (list $ctx baseName machine)
*/}}
{{- define "openstack-cluster.machineTemplateName" -}}
{{- $spec := include "openstack-cluster.machineTemplateSpec" (list (index . 0) (index . 2)) -}}
{{- printf "%s-%s" (index . 1 | trunc 54) (sha256sum $spec | trunc 8) -}}
{{- end -}}

{{/* The spec of a MachineHealthCheck. Argument: (list $ctx healthCheckSpec selectorLabels) */}}
{{- define "openstack-cluster.machineHealthCheckSpec" -}}
clusterName: {{ include "openstack-cluster.clusterName" (index . 0) }}
selector:
  matchLabels: {{ index . 2 | nindent 4 }}
{{ toYaml (index . 1) }}
{{- end -}}
