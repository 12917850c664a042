{{/*
Names, labels and addresses shared by the templates.
*/}}

{{- define "infergate.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "infergate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := .Values.nameOverride | default .Chart.Name }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "infergate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of one component. Call with (dict "context" $ "component" "triton").
*/}}
{{- define "infergate.labels" -}}
helm.sh/chart: {{ include "infergate.chart" .context }}
{{ include "infergate.selectorLabels" . }}
app.kubernetes.io/version: {{ .context.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .context.Release.Service }}
{{- end }}

{{- define "infergate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infergate.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Component names. KubeRay derives longer names from the RayService's (<name>-<5 chars>-head-...),
so that one is kept short.
*/}}
{{- define "infergate.rayServiceName" -}}
{{- printf "%s-ray" (include "infergate.fullname" . | trunc 36 | trimSuffix "-") }}
{{- end }}
{{- define "infergate.grpcName" -}}
{{- printf "%s-grpc" (include "infergate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "infergate.rayMetricsName" -}}
{{- printf "%s-metrics" (include "infergate.rayServiceName" .) }}
{{- end }}
{{- define "infergate.tritonName" -}}
{{- printf "%s-triton" (include "infergate.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}
{{- define "infergate.tritonHeadlessName" -}}
{{- printf "%s-pods" (include "infergate.tritonName" .) }}
{{- end }}
{{- define "infergate.modelsClaimName" -}}
{{- .Values.modelRepository.existingClaim | default (printf "%s-models" (include "infergate.fullname" . | trunc 49 | trimSuffix "-")) }}
{{- end }}
{{- define "infergate.controlPlaneName" -}}
{{- printf "%s-control-plane" (include "infergate.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}
{{- define "infergate.mlflowName" -}}
{{- printf "%s-mlflow" (include "infergate.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}
{{- define "infergate.postgresqlName" -}}
{{- printf "%s-postgresql" (include "infergate.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}
{{- define "infergate.prometheusName" -}}
{{- printf "%s-prometheus" (include "infergate.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}
{{- define "infergate.grafanaName" -}}
{{- printf "%s-grafana" (include "infergate.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}

{{/*
Images.
*/}}
{{- define "infergate.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- define "infergate.mlflowImage" -}}
{{- if .Values.mlflow.image.repository }}
{{- printf "%s:%s" .Values.mlflow.image.repository (.Values.mlflow.image.tag | default "latest") }}
{{- else }}
{{- include "infergate.image" . }}
{{- end }}
{{- end }}

{{/*
Ports that are not settings: Triton's standard ports and the Ray Serve HTTP port.
*/}}
{{- define "infergate.tritonHttpPort" -}}8000{{- end }}
{{- define "infergate.tritonGrpcPort" -}}8001{{- end }}
{{- define "infergate.tritonMetricsPort" -}}8002{{- end }}
{{- define "infergate.servePort" -}}8000{{- end }}

{{/*
Whether a served version may be out of Triton until a request asks for it: a budget of
loaded versions (0 means none) or idle unloads, as TritonSettings.loads_on_demand reads them.
*/}}
{{- define "infergate.loadsOnDemand" -}}
{{- if or .Values.triton.maxLoadedVersions .Values.triton.idleUnloadS }}true{{ else }}false{{ end }}
{{- end }}

{{/*
Addresses inside the cluster.
*/}}
{{- define "infergate.mlflowUrl" -}}
{{- printf "http://%s:%d" (include "infergate.mlflowName" .) (int .Values.mlflow.port) }}
{{- end }}
{{- define "infergate.controlPlaneUrl" -}}
{{- printf "http://%s:%d" (include "infergate.controlPlaneName" .) (int .Values.controlPlane.port) }}
{{- end }}
{{- define "infergate.tritonGrpcAddress" -}}
{{- printf "%s:%s" (include "infergate.tritonName" .) (include "infergate.tritonGrpcPort" .) }}
{{- end }}
{{- define "infergate.prometheusUrl" -}}
{{- if .Values.grafana.prometheusUrl }}
{{- .Values.grafana.prometheusUrl }}
{{- else if .Values.prometheus.enabled }}
{{- printf "http://%s:9090" (include "infergate.prometheusName" .) }}
{{- else }}
{{- fail "grafana.enabled needs prometheus.enabled or grafana.prometheusUrl" }}
{{- end }}
{{- end }}

{{/*
Secret names: the user's existing Secret, or the one this chart generates.
*/}}
{{- define "infergate.controlPlaneSecretName" -}}
{{- .Values.controlPlane.auth.existingSecret | default (include "infergate.controlPlaneName" .) }}
{{- end }}
{{- define "infergate.webhookKeySecretName" -}}
{{- .Values.mlflow.webhookEncryptionKey.existingSecret | default (printf "%s-webhook-key" (include "infergate.mlflowName" .)) }}
{{- end }}
{{- define "infergate.mlflowAuthSecretName" -}}
{{- .Values.mlflow.auth.existingSecret | default (printf "%s-auth" (include "infergate.mlflowName" .)) }}
{{- end }}
{{/*
The MLflow user the platform's clients sign in as (control plane, Ray pods), when auth is on.
*/}}
{{- define "infergate.mlflowClientEnv" -}}
{{- if .Values.mlflow.auth.enabled -}}
- name: MLFLOW_TRACKING_USERNAME
  value: admin
- name: MLFLOW_TRACKING_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "infergate.mlflowAuthSecretName" . }}
      key: admin-password
{{- end }}
{{- end }}
{{- define "infergate.apiKeysSecretName" -}}
{{- .Values.frontend.apiKeys.existingSecret | default (printf "%s-api-keys" (include "infergate.fullname" . | trunc 49 | trimSuffix "-")) }}
{{- end }}
{{- define "infergate.postgresqlSecretName" -}}
{{- .Values.postgresql.existingSecret | default (include "infergate.postgresqlName" .) }}
{{- end }}
{{- define "infergate.grafanaSecretName" -}}
{{- .Values.grafana.admin.existingSecret | default (include "infergate.grafanaName" .) }}
{{- end }}

{{/*
A generated secret value, base64-encoded for a Secret's data, kept across upgrades: the value
already stored in the Secret when there is one (lookup answers nothing in `helm template`), 32
random letters and digits otherwise, or with "fernet" true a Fernet key (32 random bytes,
base64). Call with (dict "context" $ "secret" NAME "key" KEY ["fernet" true]).
*/}}
{{- define "infergate.generatedSecretValue" -}}
{{- $existing := lookup "v1" "Secret" .context.Release.Namespace .secret }}
{{- $value := randAlphaNum 32 }}
{{- if .fernet }}
{{- $value = $value | b64enc }}
{{- end }}
{{- dig "data" .key ($value | b64enc) $existing }}
{{- end }}

{{/*
MLflow's database URI as container env: from the user's Secret, or composed for the bundled
PostgreSQL (Kubernetes expands $(POSTGRES_PASSWORD) from the entry before it).
*/}}
{{- define "infergate.mlflowBackendStoreEnv" -}}
{{- if .Values.mlflow.backendStore.existingSecret -}}
- name: MLFLOW_BACKEND_STORE_URI
  valueFrom:
    secretKeyRef:
      name: {{ .Values.mlflow.backendStore.existingSecret }}
      key: {{ .Values.mlflow.backendStore.uriKey }}
{{- else if .Values.postgresql.enabled -}}
- name: POSTGRES_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "infergate.postgresqlSecretName" . }}
      key: password
- name: MLFLOW_BACKEND_STORE_URI
  value: {{ printf "postgresql://%s:$(POSTGRES_PASSWORD)@%s:5432/%s" .Values.postgresql.username (include "infergate.postgresqlName" .) .Values.postgresql.database | quote }}
{{- else }}
{{- fail "MLflow needs a database: set mlflow.backendStore.existingSecret, or postgresql.enabled=true" }}
{{- end }}
{{- end }}

{{/*
API keys (frontend.apiKeys). The key file reaches every pod that runs infergate code (the Ray
pods, where replicas read it, and the control plane, which refuses to start on an empty one)
at one path. The Secret is mounted as a folder, not with subPath: only a folder mount follows
an update of the Secret, which the replicas read again without a restart.
*/}}
{{- define "infergate.apiKeysDir" -}}/etc/infergate/api-keys{{- end }}
{{- define "infergate.apiKeysFile" -}}{{ include "infergate.apiKeysDir" . }}/api-keys.yaml{{- end }}
{{- define "infergate.apiKeysEnv" -}}
{{- if .Values.frontend.apiKeys.enabled -}}
- name: INFERGATE_FRONTEND__API_KEYS_FILE
  value: {{ include "infergate.apiKeysFile" . | quote }}
{{- end }}
{{- end }}
{{- define "infergate.apiKeysVolumeMount" -}}
{{- if .Values.frontend.apiKeys.enabled -}}
- name: api-keys
  mountPath: {{ include "infergate.apiKeysDir" . }}
  readOnly: true
{{- end }}
{{- end }}
{{- define "infergate.apiKeysVolume" -}}
{{- if .Values.frontend.apiKeys.enabled -}}
- name: api-keys
  secret:
    secretName: {{ include "infergate.apiKeysSecretName" . }}
    # The key file only: a generated key stays in the Secret, for the operator to read.
    items:
      - key: api-keys.yaml
        path: api-keys.yaml
{{- end }}
{{- end }}

{{/*
The data of the generated API keys Secret: api-keys.yaml, the key file, and api-key, the key
it was made with. What the Secret holds already (lookup; nothing in `helm template`) is kept:
its key file as it is, since operators add keys to it, and the generated key while it is
there. Only without a key file is a key made, as `infergate keys create` makes one: "ig_" and
43 random letters and digits (256 bits), stored as its SHA-256 digest, for every model.
Call with (dict "existing" SECRET), SECRET as lookup returns it.
*/}}
{{- define "infergate.apiKeysSecretData" -}}
{{- $data := dig "data" (dict) .existing }}
{{- if hasKey $data "api-keys.yaml" }}
{{- toYaml (pick $data "api-keys.yaml" "api-key") }}
{{- else }}
{{- $key := printf "ig_%s" (randAlphaNum 43) }}
api-key: {{ $key | b64enc }}
api-keys.yaml: {{ include "infergate.apiKeyFile" $key | b64enc }}
{{- end }}
{{- end }}

{{/*
A key file holding one key, the one passed, as `infergate keys create` writes it.
*/}}
{{- define "infergate.apiKeyFile" -}}
# infergate API keys: digests only; `infergate keys create` adds one.
keys:
- id: generated
  sha256: {{ sha256sum . }}
  models:
  - '*'
{{ end }}
