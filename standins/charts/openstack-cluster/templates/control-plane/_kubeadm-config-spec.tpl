{{- /* Layers of the control plane's kubeadmConfigSpec, merged in this order (lists concatenate). */}}

{{- define "openstack-cluster.controlPlane.kubeadm.base" -}}
clusterConfiguration:
  apiServer:
    extraArgs:
      cloud-provider: external
      v: {{ .Values.apiServer.logLevel | quote }}
  controllerManager:
    extraArgs:
      cloud-provider: external
  etcd:
    local:
      dataDir: {{ .Values.etcd.dataDir }}
      extraArgs: {{ toYaml (.Values.etcd.extraArgs | default dict) | nindent 8 }}
initConfiguration:
  nodeRegistration:
    name: {{ printf "'{{ local_hostname }}'" }}
    kubeletExtraArgs:
      cloud-provider: external
joinConfiguration:
  nodeRegistration:
    name: {{ printf "'{{ local_hostname }}'" }}
    kubeletExtraArgs:
      cloud-provider: external
{{- end -}}

{{- define "openstack-cluster.controlPlane.kubeadm.oidc" -}}
{{- with .Values.oidc }}
{{- if .issuerUrl }}
clusterConfiguration:
  apiServer:
    extraArgs:
      oidc-issuer-url: {{ quote .issuerUrl }}
      oidc-client-id: {{ .clientId | required "oidc.clientId is required when oidc.issuerUrl is set" | quote }}
      oidc-username-claim: {{ quote .usernameClaim }}
      oidc-username-prefix: {{ quote .usernamePrefix }}
      oidc-groups-claim: {{ quote .groupsClaim }}
      oidc-groups-prefix: {{ quote .groupsPrefix }}
      oidc-signing-algs: {{ quote .signingAlgs }}
{{- end }}
{{- end }}
{{- end -}}

{{- /*
  Upstream reads the key from Secret <release>-etcd-key with `lookup` (the capi-operator creates
  it before installing). `helm template` has no cluster, so lookup is empty there and the key is
  rendered empty rather than failing: the stand-in only has to accept the values harmlessly.
*/}}
{{- define "openstack-cluster.controlPlane.kubeadm.etcdEncryption" -}}
{{- if .Values.etcd.encryption.enabled }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (printf "%s-etcd-key" .Release.Name) }}
clusterConfiguration:
  apiServer:
    extraArgs:
      encryption-provider-config: /etc/kubernetes/enc/enc.yaml
files:
  - path: /etc/kubernetes/enc/enc.yaml
    owner: root:root
    permissions: "0600"
    content: |
      apiVersion: apiserver.config.k8s.io/v1
      kind: EncryptionConfiguration
      resources:
        - resources:
            {{- toYaml .Values.etcd.encryption.resources | nindent 12 }}
          providers:
            - {{ .Values.etcd.encryption.provider }}:
                keys:
                  - name: key1
                    secret: {{ dig "data" "key" "" $secret | quote }}
            - identity: {}
{{- end }}
{{- end -}}

{{- define "openstack-cluster.controlPlane.kubeadmConfigSpec" -}}
{{- $spec := include "openstack-cluster.controlPlane.kubeadm.base" . | fromYaml -}}
{{- $layers := list
      (include "openstack-cluster.controlPlane.kubeadm.oidc" . | fromYaml)
      (include "openstack-cluster.controlPlane.kubeadm.etcdEncryption" . | fromYaml)
      (.Values.controlPlane.kubeadmConfigSpec | default dict)
-}}
{{- range $layer := $layers -}}
{{- $spec = (include "openstack-cluster.merge" (list $spec $layer true) | fromJson).v -}}
{{- end -}}
{{- toYaml $spec -}}
{{- end -}}
