{{/* <release>-<chart>, or just the release when it already contains the chart name. */}}
{{- define "zenith-apiserver.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | lower | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | lower | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The file the client reads: the ConfigMap key, mounted from /etc/zenith on the host. */}}
{{- define "zenith-apiserver.configFile" -}}
client-apiserver.yaml
{{- end -}}

{{- define "zenith-apiserver.image" -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) -}}
{{- end -}}
