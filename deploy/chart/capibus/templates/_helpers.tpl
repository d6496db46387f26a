{{/*
Names, labels and the workload model every template renders from.

A "workload" is one Deployment: its name, the services its process runs, what it serves and
which values configure it. `capibus.workloads` computes them once from `mode` and the enabled
services (split: one per service; allinone: one for every service the all-in-one process can
run, plus the Ladybug API, which it cannot), so Deployments, metrics Services, PDBs,
NetworkPolicies, KEDA objects and the test Pod all agree on them.
*/}}

{{- define "capibus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "capibus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<fullname>-<suffix>", kept a valid DNS label: (dict "root" $ "suffix" "writer") */}}
{{- define "capibus.componentName" -}}
{{- printf "%s-%s" (include "capibus.fullname" .root) .suffix | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "capibus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "capibus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: capibus
{{- end }}

{{/* (dict "root" $ "component" "writer") */}}
{{- define "capibus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "capibus.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* (dict "root" $ "component" "writer") */}}
{{- define "capibus.componentLabels" -}}
{{ include "capibus.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The facts of files/services.yaml, as a YAML string (callers: fromYaml). */}}
{{- define "capibus.catalog" -}}
{{- .Files.Get "files/services.yaml" }}
{{- end }}

{{/*
The enabled services' dash names, sorted, as a JSON list (callers: fromJsonArray). The RBAC
template ranges over it.
*/}}
{{- define "capibus.enabledServices" -}}
{{- $enabled := list }}
{{- range $name := keys .Values.services | sortAlpha }}
{{- if (index $.Values.services $name).enabled }}
{{- $enabled = append $enabled $name }}
{{- end }}
{{- end }}
{{- toJson $enabled }}
{{- end }}

{{/*
The ServiceAccount a service runs as: (dict "root" $ "service" "writer") ->
"<fullname>-writer" in split mode, "<fullname>" in allinone mode (one process, one identity:
its RBAC is the union of the enabled services' rules).
*/}}
{{- define "capibus.serviceAccountName" -}}
{{- if eq .root.Values.mode "split" }}
{{- include "capibus.componentName" (dict "root" .root "suffix" .service) }}
{{- else }}
{{- include "capibus.fullname" .root }}
{{- end }}
{{- end }}

{{/*
The workloads (Deployments) as a JSON list (callers: fromJsonArray). Each: name, component
(label), services, serviceAccount, replicas, values (the services.<name> or allinone block
configuring its pod), serves (metrics, webhook, api) and, in split mode, module.
*/}}
{{- define "capibus.workloads" -}}
{{- $root := . }}
{{- $catalog := include "capibus.catalog" . | fromYaml }}
{{- $enabled := include "capibus.enabledServices" . | fromJsonArray }}
{{- $workloads := list }}
{{- $together := list }}
{{- range $name := $enabled }}
{{- $facts := index $catalog $name }}
{{- if and (eq $root.Values.mode "allinone") (hasKey $facts "component") }}
{{- $together = append $together $name }}
{{- else }}
{{- $workloads = append $workloads (dict
    "name" (include "capibus.componentName" (dict "root" $root "suffix" $name))
    "component" $name
    "services" (list $name)
    "module" $facts.module
    "serviceAccount" (include "capibus.serviceAccountName" (dict "root" $root "service" $name))
    "replicas" (index $root.Values.services $name).replicas
    "values" (index $root.Values.services $name)
    "serves" (list $facts.serves)) }}
{{- end }}
{{- end }}
{{- if $together }}
{{- $serves := list "metrics" }}
{{- if has "admission" $together }}{{ $serves = append $serves "webhook" }}{{ end }}
{{- $workloads = prepend $workloads (dict
    "name" (include "capibus.fullname" $root)
    "component" "allinone"
    "services" $together
    "serviceAccount" (include "capibus.fullname" $root)
    "replicas" $root.Values.allinone.replicas
    "values" $root.Values.allinone
    "serves" $serves) }}
{{- end }}
{{- toJson $workloads }}
{{- end }}

{{/* The container's command and args: (dict "root" $ "workload" $w) */}}
{{- define "capibus.command" -}}
{{- $catalog := include "capibus.catalog" .root | fromYaml }}
{{- if eq .workload.component "allinone" }}
{{- $components := list }}
{{- range .workload.services }}{{ $components = append $components (index $catalog .).component }}{{ end }}
args: ["run", "--only", {{ join "," $components | quote }}]
{{- else }}
command: ["python", "-m", {{ .workload.module | quote }}]
{{- end }}
{{- end }}

{{- define "capibus.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "capibus.natsServiceName" -}}
{{- include "capibus.componentName" (dict "root" . "suffix" "nats") }}
{{- end }}

{{- define "capibus.redisServiceName" -}}
{{- include "capibus.componentName" (dict "root" . "suffix" "redis") }}
{{- end }}

{{- define "capibus.webhookServiceName" -}}
{{- include "capibus.componentName" (dict "root" . "suffix" "admission") }}
{{- end }}

{{- define "capibus.webhookSecretName" -}}
{{- include "capibus.componentName" (dict "root" . "suffix" "admission-tls") }}
{{- end }}

{{/* A value as an environment variable's text: strings as they are, the rest as JSON. */}}
{{- define "capibus.envText" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/*
NATS_URL and REDIS_URL as a list of EnvVar, with the variables holding their credentials
first: the URLs name them as $(VAR), which Kubernetes expands from earlier entries. With
access.enabled the URLs carry no credential: each service logs in as its own user from the
files of its mounted Secret (CAPIBUS_CREDENTIALS__DIR). With tls.enabled a bundled server's URL
is tls:// or rediss://, an external one must already say so (the render fails otherwise: a
rewritten scheme would hide that the URL given is not the one used), and each CA the pods mount
("capibus.serverCAs") is named in CAPIBUS_TLS__<SERVER>_CA_FILE.
*/}}
{{- define "capibus.connectionEnv" -}}
{{- $perUser := .Values.access.enabled }}
{{- if $perUser }}
- name: CAPIBUS_CREDENTIALS__DIR
  value: {{ .Values.access.mountPath | quote }}
{{- end }}
{{- $nats := .Values.nats }}
{{- $natsSecret := $nats.existingSecret }}
{{- $natsToken := and (not $perUser) $natsSecret.name $natsSecret.tokenKey }}
{{- if $natsToken }}
- name: CAPIBUS_NATS_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ $natsSecret.name | quote }}, key: {{ $natsSecret.tokenKey | quote }}}
{{- end }}
- name: NATS_URL
{{- if $nats.deploy }}
  value: {{ printf "%s://%s%s:4222" (ternary "tls" "nats" $nats.tls.enabled) (ternary "$(CAPIBUS_NATS_TOKEN)@" "" (not (empty $natsToken))) (include "capibus.natsServiceName" .) | quote }}
{{- else if and $natsSecret.name $natsSecret.urlKey }}
  valueFrom:
    secretKeyRef: {name: {{ $natsSecret.name | quote }}, key: {{ $natsSecret.urlKey | quote }}}
{{- else }}
{{- $url := required "nats.url (or nats.existingSecret.urlKey, or nats.deploy) is required" $nats.url }}
{{- if and $nats.tls.enabled (not (hasPrefix "tls://" $url)) }}
{{- fail (printf "nats.tls.enabled needs a tls:// nats.url, not %s..." (regexFind "^[a-z]*:?/*" $url)) }}
{{- end }}
{{- if $natsToken }}{{ $url = regexReplaceAll "^([a-z]+)://" $url "${1}://$(CAPIBUS_NATS_TOKEN)@" }}{{ end }}
  value: {{ $url | quote }}
{{- end }}
{{- $redis := .Values.redis }}
{{- $redisSecret := $redis.existingSecret }}
{{- $redisPassword := and (not $perUser) $redisSecret.name $redisSecret.passwordKey }}
{{- if $redisPassword }}
- name: CAPIBUS_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $redisSecret.name | quote }}, key: {{ $redisSecret.passwordKey | quote }}}
{{- end }}
- name: REDIS_URL
{{- if $redis.deploy }}
  value: {{ printf "%s://%s%s:6379/0" (ternary "rediss" "redis" $redis.tls.enabled) (ternary ":$(CAPIBUS_REDIS_PASSWORD)@" "" (not (empty $redisPassword))) (include "capibus.redisServiceName" .) | quote }}
{{- else if and $redisSecret.name $redisSecret.urlKey }}
  valueFrom:
    secretKeyRef: {name: {{ $redisSecret.name | quote }}, key: {{ $redisSecret.urlKey | quote }}}
{{- else }}
{{- $url := required "redis.url (or redis.existingSecret.urlKey, or redis.deploy) is required" $redis.url }}
{{- if and $redis.tls.enabled (not (hasPrefix "rediss://" $url)) }}
{{- fail (printf "redis.tls.enabled needs a rediss:// redis.url, not %s..." (regexFind "^[a-z]*:?/*" $url)) }}
{{- end }}
{{- if $redisPassword }}{{ $url = regexReplaceAll "^([a-z]+)://" $url "${1}://:$(CAPIBUS_REDIS_PASSWORD)@" }}{{ end }}
  value: {{ $url | quote }}
{{- end }}
{{- range include "capibus.serverCAs" . | fromJsonArray }}
- name: {{ printf "CAPIBUS_TLS__%s_CA_FILE" (upper .server) }}
  value: {{ printf "%s/ca.crt" .dir | quote }}
{{- end }}
{{- end }}

{{/*
The environment of a workload's container: (dict "root" $ "workload" $w). In order: the pod's
name as replica id, the connections, the chart's settings, `config` (global, then each
service's, then allinone's: later wins), then `env` lists as given (global, services',
allinone's). A name set by a later source is dropped from the earlier ones, so every name
appears once.
*/}}
{{- define "capibus.env" -}}
{{- $root := .root }}
{{- $w := .workload }}
{{- $values := $root.Values }}
{{- $settings := dict
    "PARTITIONS" $values.partitions
    "METRICS_PORT" $values.metrics.port
    "RETENTION__MAX_AGE_SECONDS" $values.retention.maxAgeSeconds
    "RETENTION__MAX_BYTES" $values.retention.maxBytes
    "RETENTION__DUPLICATE_WINDOW_SECONDS" $values.retention.duplicateWindowSeconds
    "LOG_LEVEL" $values.logging.level
    "LOG_JSON" $values.logging.json }}
{{- if has "admission" $w.services }}
{{- $_ := set $settings "ADMISSION__CERT_FILE" "/etc/capibus/webhook/tls.crt" }}
{{- $_ := set $settings "ADMISSION__KEY_FILE" "/etc/capibus/webhook/tls.key" }}
{{- $_ := set $settings "ADMISSION__PORT" $values.webhook.port }}
{{- end }}
{{- if has "ladybug-api" $w.services }}
{{- $_ := set $settings "LADYBUG__API_PORT" $values.ladybugApi.port }}
{{- end }}
{{- $settings = merge (deepCopy ($values.config | default dict)) $settings }}
{{- range $w.services }}
{{- $settings = merge (deepCopy ((index $values.services .).config | default dict)) $settings }}
{{- end }}
{{- if eq $w.component "allinone" }}
{{- $settings = merge (deepCopy ($values.allinone.config | default dict)) $settings }}
{{- end }}
{{- $userEnv := concat ($values.env | default list) }}
{{- range $w.services }}
{{- $userEnv = concat $userEnv ((index $values.services .).env | default list) }}
{{- end }}
{{- if eq $w.component "allinone" }}
{{- $userEnv = concat $userEnv ($values.allinone.env | default list) }}
{{- end }}
{{- $last := dict }}
{{- range $i, $e := $userEnv }}{{ $_ := set $last $e.name $i }}{{ end }}
{{- $chart := include "capibus.connectionEnv" $root | fromYamlArray }}
{{- $chart = prepend $chart (dict "name" "CAPIBUS_REPLICA" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) }}
{{- range $key := keys $settings | sortAlpha }}
{{- $chart = append $chart (dict "name" (printf "CAPIBUS_%s" $key) "value" (include "capibus.envText" (index $settings $key))) }}
{{- end }}
{{- $final := list }}
{{- range $chart }}
{{- if not (hasKey $last .name) }}{{ $final = append $final . }}{{ end }}
{{- end }}
{{- range $i, $e := $userEnv }}
{{- if eq (index $last $e.name) $i }}{{ $final = append $final $e }}{{ end }}
{{- end }}
{{- toYaml $final }}
{{- end }}

{{/* envFrom of a workload: (dict "root" $ "workload" $w) */}}
{{- define "capibus.envFrom" -}}
{{- $values := .root.Values }}
{{- $all := concat ($values.envFrom | default list) }}
{{- range .workload.services }}
{{- $all = concat $all ((index $values.services .).envFrom | default list) }}
{{- end }}
{{- if eq .workload.component "allinone" }}
{{- $all = concat $all ($values.allinone.envFrom | default list) }}
{{- end }}
{{- toYaml $all }}
{{- end }}

{{/*
Topology spread constraints with the workload's selector filled in where absent:
(dict "root" $ "constraints" $list "component" "writer")
*/}}
{{- define "capibus.topologySpread" -}}
{{- $selector := include "capibus.selectorLabels" (dict "root" .root "component" .component) | fromYaml }}
{{- $filled := list }}
{{- range .constraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
{{- $filled = append $filled $c }}
{{- end }}
{{- toYaml $filled }}
{{- end }}

{{/*
A certificate the chart makes: the one in its Secret if there is one (so upgrades keep it and
whoever trusts its CA stays right), else a new CA and certificate for the given DNS names.
Computed once per render and kept on .Values under .cache, so the Secret, whatever carries the
CA and the pods' checksums see the same one. JSON with base64 "crt", "key", "ca".
(dict "root" $ "cache" "__webhookTLS" "secret" $name "ca" $caName "names" $dnsNames)
*/}}
{{- define "capibus.keptOrNewTLS" -}}
{{- $values := .root.Values }}
{{- if not (hasKey $values .cache) }}
{{- $secret := lookup "v1" "Secret" .root.Release.Namespace .secret }}
{{- $data := dict }}
{{- if $secret }}{{ $data = $secret.data | default dict }}{{ end }}
{{- $tls := dict }}
{{- if and (index $data "tls.crt") (index $data "tls.key") (index $data "ca.crt") }}
{{- $tls = dict "crt" (index $data "tls.crt") "key" (index $data "tls.key") "ca" (index $data "ca.crt") }}
{{- else }}
{{- $days := int $values.webhook.generated.validityDays }}
{{- $ca := genCA .ca $days }}
{{- $cert := genSignedCert (first .names) nil .names $days $ca }}
{{- $tls = dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($ca.Cert | b64enc) }}
{{- end }}
{{- $_ := set $values .cache $tls }}
{{- end }}
{{- toJson (index $values .cache) }}
{{- end }}

{{/* A Service's DNS names, the cluster-local one first: (dict "root" $ "service" $name) */}}
{{- define "capibus.serviceDNSNames" -}}
{{- $ns := .root.Release.Namespace }}
{{- toJson (list (printf "%s.%s.svc" .service $ns) .service (printf "%s.%s" .service $ns) (printf "%s.%s.svc.%s" .service $ns .root.Values.clusterDomain)) }}
{{- end }}

{{/*
With webhook.certManager.enabled, the issuer of every certificate the chart asks cert-manager
for (the webhook's, and NATS's and Redis's without tls.secretName), as JSON: the user's
issuerRef, else the chart's CA Issuer ("capibus.caName", templates/tls.yaml).
*/}}
{{- define "capibus.certIssuerRef" -}}
{{- toJson (.Values.webhook.certManager.issuerRef | default (dict "kind" "Issuer" "name" (include "capibus.caName" .))) }}
{{- end }}

{{/* The chart's CA under cert-manager: its Certificate, Secret and CA Issuer share the name. */}}
{{- define "capibus.caName" -}}
{{- include "capibus.componentName" (dict "root" . "suffix" "ca") }}
{{- end }}

{{/* The webhook's serving certificate when the chart makes it ("capibus.keptOrNewTLS"). */}}
{{- define "capibus.webhookTLS" -}}
{{- include "capibus.keptOrNewTLS" (dict
    "root" .
    "cache" "__webhookTLS"
    "secret" (include "capibus.webhookSecretName" .)
    "ca" (printf "%s-admission-ca" (include "capibus.fullname" .))
    "names" (include "capibus.serviceDNSNames" (dict "root" . "service" (include "capibus.webhookServiceName" .)) | fromJsonArray)) }}
{{- end }}

{{/*
TLS to NATS and Redis (nats.tls, redis.tls; docs/install.md, "TLS to NATS and Redis"). The
helpers below take (dict "root" $ "server" "nats") or "redis".

The Secret: tls.secretName when given (an external server's CA, or the bundled server's
kubernetes.io/tls Secret), else <fullname>-<server>-tls, which the chart fills: from
cert-manager when webhook.certManager.enabled (the same switch, issuer and durations as the
webhook's certificate), otherwise generated and kept across upgrades like the webhook's.
*/}}
{{- define "capibus.serverTLSSecretName" -}}
{{- (index .root.Values .server).tls.secretName | default (include "capibus.componentName" (dict "root" .root "suffix" (printf "%s-tls" .server))) }}
{{- end }}

{{/*
The bundled server's DNS names its certificate holds: its Service's and, for NATS, each
server's name under the headless Service (routes connect to them, and clients reconnect to the
client URLs the servers advertise). Always the three possible servers, so a certificate kept
from a 1-server install still holds after `nats.replicas: 3`.
*/}}
{{- define "capibus.serverDNSNames" -}}
{{- $service := include (printf "capibus.%sServiceName" .server) .root }}
{{- $names := include "capibus.serviceDNSNames" (dict "root" .root "service" $service) | fromJsonArray }}
{{- if eq .server "nats" }}
{{- $headless := include "capibus.componentName" (dict "root" .root "suffix" "nats-headless") }}
{{- range $i := until 3 }}
{{- $names = append $names (printf "%s-%d.%s.%s.svc.%s" $service $i $headless $.root.Release.Namespace $.root.Values.clusterDomain) }}
{{- $names = append $names (printf "%s-%d.%s.%s.svc" $service $i $headless $.root.Release.Namespace) }}
{{- end }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/*
What the release knows of the server's TLS Secret, JSON with base64 "crt", "key", "ca" (any
may be missing): the generated certificate, or what `lookup` reads of the user's or
cert-manager's Secret (nothing under `helm template`). Only checksums read the latter: a
replaced Secret rolls the pods at the next `helm upgrade`.
*/}}
{{- define "capibus.serverTLS" -}}
{{- $tls := (index .root.Values .server).tls }}
{{- $deploy := (index .root.Values .server).deploy }}
{{- $secret := include "capibus.serverTLSSecretName" . }}
{{- if and $deploy (not $tls.secretName) (not .root.Values.webhook.certManager.enabled) }}
{{- include "capibus.keptOrNewTLS" (dict
    "root" .root
    "cache" (printf "__%sTLS" .server)
    "secret" $secret
    "ca" (printf "%s-%s-ca" (include "capibus.fullname" .root) .server)
    "names" (include "capibus.serverDNSNames" . | fromJsonArray)) }}
{{- else if or $deploy $tls.secretName }}
{{- $data := (lookup "v1" "Secret" .root.Release.Namespace $secret).data | default dict }}
{{- toJson (dict "crt" (index $data "tls.crt" | default "") "ca" (index $data "ca.crt" | default "")) }}
{{- else }}
{{- toJson dict }}
{{- end }}
{{- end }}

{{/*
The CAs the capibus pods mount, as a JSON list of {server, secret, dir}: one per server with
TLS whose CA the release knows (a bundled server's, or tls.secretName's); an external server
without one is trusted through the system CAs.
*/}}
{{- define "capibus.serverCAs" -}}
{{- $cas := list }}
{{- range $server := list "nats" "redis" }}
{{- $values := index $.Values $server }}
{{- if and $values.tls.enabled (or $values.deploy $values.tls.secretName) }}
{{- $cas = append $cas (dict "server" $server "secret" (include "capibus.serverTLSSecretName" (dict "root" $ "server" $server)) "dir" (printf "/etc/capibus/tls/%s" $server)) }}
{{- end }}
{{- end }}
{{- toJson $cas }}
{{- end }}

{{/* KEDA's monitoring endpoint of NATS (host:port). */}}
{{- define "capibus.natsMonitoringEndpoint" -}}
{{- if .Values.keda.natsServerMonitoringEndpoint }}
{{- .Values.keda.natsServerMonitoringEndpoint }}
{{- else if .Values.nats.deploy }}
{{- printf "%s.%s.svc.%s:8222" (include "capibus.natsServiceName" .) .Release.Namespace .Values.clusterDomain }}
{{- else }}
{{- fail "keda.natsServerMonitoringEndpoint is required when NATS is not deployed by the chart" }}
{{- end }}
{{- end }}

{{/*
Bus access (access.enabled; docs/security.md, "Bus access"): files/access.json is generated
from every service's services/<svc>/access.py (`make rbac`), the same description the local
stack's servers run with (shared/access.py).
*/}}
{{- define "capibus.access" -}}
{{- .Files.Get "files/access.json" }}
{{- end }}

{{/* The Secret holding a user's passwords: (dict "root" $ "user" "writer") */}}
{{- define "capibus.credentialsSecretName" -}}
{{- include "capibus.componentName" (dict "root" .root "suffix" (printf "bus-%s" .user)) }}
{{- end }}

{{/* The environment variable a server reads a user's password from: (dict "system" "NATS" "user" "writer") */}}
{{- define "capibus.passwordVar" -}}
{{- printf "CAPIBUS_%s_PASSWORD_%s" .system (.user | upper | replace "-" "_") }}
{{- end }}

{{/* Every user's password as EnvVars for a server: (dict "root" $ "system" "NATS") */}}
{{- define "capibus.passwordEnv" -}}
{{- $access := include "capibus.access" .root | fromJson }}
{{- $key := printf "%s-password" (.system | lower) }}
{{- range $user := prepend (keys $access.users | sortAlpha) $access.admin }}
- name: {{ include "capibus.passwordVar" (dict "system" $.system "user" $user) }}
  valueFrom:
    secretKeyRef: {name: {{ include "capibus.credentialsSecretName" (dict "root" $.root "user" $user) | quote }}, key: {{ $key }}}
{{- end }}
{{- end }}

{{/* The JetStream API on one durable: (dict "stream" "S" "durable" "d") as a JSON list */}}
{{- define "capibus.durableApi" -}}
{{- $s := .stream }}{{ $d := .durable }}
{{- toJson (list
    (printf "$JS.API.CONSUMER.CREATE.%s.%s" $s $d)
    (printf "$JS.API.CONSUMER.CREATE.%s.%s.>" $s $d)
    (printf "$JS.API.CONSUMER.DURABLE.CREATE.%s.%s" $s $d)
    (printf "$JS.API.CONSUMER.INFO.%s.%s" $s $d)
    (printf "$JS.API.CONSUMER.MSG.NEXT.%s.%s" $s $d)
    (printf "$JS.ACK.%s.%s.>" $s $d)) }}
{{- end }}

{{/*
The users of nats-server's authorization block, one JSON object a line, as shared/access.py
renders them (nats_users): the stems in access.json times `partitions`.
*/}}
{{- define "capibus.natsUsers" -}}
{{- $access := include "capibus.access" . | fromJson }}
{{- $partitions := int .Values.partitions }}
{{- $admin := include "capibus.passwordVar" (dict "system" "NATS" "user" $access.admin) }}
{{- printf "{\"user\": %s, \"password\": $%s}" (toJson $access.admin) $admin }}
{{- range $user := keys $access.users | sortAlpha }}
{{- $u := index $access.users $user }}
{{- $allow := $u.publish }}
{{- range $d := $u.durables }}{{ range $p := until $partitions }}
{{- $allow = concat $allow (include "capibus.durableApi" (dict "stream" (index $d 0) "durable" (printf "%s-p%d" (index $d 1) $p)) | fromJsonArray) }}
{{- end }}{{ end }}
{{- $deny := list }}
{{- range $d := $u.deny }}{{ range $p := until $partitions }}
{{- $name := printf "%s-p%d" (index $d 1) $p }}
{{- $deny = concat $deny (include "capibus.durableApi" (dict "stream" (index $d 0) "durable" $name) | fromJsonArray) (list (printf "$JS.API.CONSUMER.DELETE.%s.%s" (index $d 0) $name)) }}
{{- end }}{{ end }}
{{- $publish := dict "allow" $allow }}
{{- if $deny }}{{ $_ := set $publish "deny" $deny }}{{ end }}
{{- $permissions := dict "publish" $publish "subscribe" (dict "allow" $u.subscribe) }}
{{- $var := include "capibus.passwordVar" (dict "system" "NATS" "user" $user) }}
{{ printf "{\"user\": %s, \"password\": $%s, \"permissions\": %s}" (toJson $user) $var (toJson $permissions) | replace "\\u003e" ">" }}
{{- end }}
{{- end }}

{{/*
The bus user of a workload (dict "root" $ "workload" $w), or "" for one that connects to
neither NATS nor Redis: the all-in-one process logs in as the union user.
*/}}
{{- define "capibus.busUser" -}}
{{- $access := include "capibus.access" .root | fromJson }}
{{- if eq .workload.component "allinone" }}
{{- $access.users | keys | has "all" | ternary "all" "" }}
{{- else }}
{{- index $access.workloads .workload.component | default "" }}
{{- end }}
{{- end }}
