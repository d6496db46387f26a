{{- /*
  The addons of the cluster-addons subchart (aliased `addons` upstream), rendered in this chart.
  Every addon is <release>-<component> with its values in Secret <release>-<component>-config,
  labelled for the addon provider's watch, and `bootstrap: true` like every chart addon.
*/}}

{{/* Argument: (list $ctx component stringData) */}}
{{- define "openstack-cluster.addons.configSecret" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ include "openstack-cluster.componentName" (list $ctx $component) }}-config
  labels:
    {{- include "openstack-cluster.componentLabels" (list $ctx $component) | nindent 4 }}
    addons.stackhpc.com/watch: ""
stringData: {{ toYaml (index . 2) | nindent 2 }}
{{- end -}}

{{/* Argument: (list $ctx component) */}}
{{- define "openstack-cluster.addons.metadata" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
metadata:
  name: {{ include "openstack-cluster.componentName" (list $ctx $component) }}
  labels: {{ include "openstack-cluster.componentLabels" (list $ctx $component) | nindent 4 }}
{{- end -}}

{{/*
A HelmRelease addon and its config Secret (keys `defaults` and `overrides`).
Argument: (list $ctx component chart targetNamespace values)
*/}}
{{- define "openstack-cluster.addons.helmRelease" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{- $configName := printf "%s-config" (include "openstack-cluster.componentName" (list $ctx $component)) -}}
{{- $values := index . 4 | default dict -}}
{{ include "openstack-cluster.addons.configSecret" (list $ctx $component (dict "defaults" "{}\n" "overrides" (printf "%s\n" (toYaml $values)))) }}
---
apiVersion: addons.stackhpc.com/v1alpha1
kind: HelmRelease
{{ include "openstack-cluster.addons.metadata" (list $ctx $component) }}
spec:
  clusterName: {{ include "openstack-cluster.clusterName" $ctx }}
  bootstrap: true
  chart: {{ toYaml (index . 2) | nindent 4 }}
  targetNamespace: {{ index . 3 }}
  releaseName: {{ $component }}
  valuesSources:
    - secret:
        name: {{ $configName }}
        key: defaults
    - secret:
        name: {{ $configName }}
        key: overrides
{{- end -}}

{{/*
A Manifests addon and its config Secret (one key per manifest file).
Argument: (list $ctx component targetNamespace manifests)
*/}}
{{- define "openstack-cluster.addons.manifests" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{ include "openstack-cluster.addons.configSecret" (list $ctx $component (index . 3 | default dict)) }}
---
apiVersion: addons.stackhpc.com/v1alpha1
kind: Manifests
{{ include "openstack-cluster.addons.metadata" (list $ctx $component) }}
spec:
  clusterName: {{ include "openstack-cluster.clusterName" $ctx }}
  bootstrap: true
  targetNamespace: {{ index . 2 }}
  releaseName: {{ $component }}
  manifestSources:
    - secret:
        name: {{ include "openstack-cluster.componentName" (list $ctx $component) }}-config
{{- end -}}
