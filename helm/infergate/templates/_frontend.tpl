{{/*
The Ray Serve config of the front-end (RayService serveConfigV2). The application is built
by infergate.serve_app:build_app from `args` (FrontendSettings of
platform/infergate/config/__init__.py).
The replicas learn what to serve from the ControlState actor that the control plane (a Ray
client of this cluster) publishes to, so a Ray cluster that KubeRay brings up afresh serves
the current versions once the control plane reconnects, without anyone re-deploying it.
The deployment options here override the ones in code.
*/}}
{{- define "infergate.serveConfig" -}}
{{- $fe := .Values.frontend -}}
proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: {{ include "infergate.servePort" . }}
{{- if $fe.grpcPort }}
grpc_options:
  port: {{ $fe.grpcPort }}
  # tritonclient's generated servicer: the front-end deployment answers its RPCs.
  grpc_servicer_functions:
    - tritonclient.grpc.service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
{{- end }}
applications:
  - name: infergate
    import_path: infergate.serve_app:build_app
    route_prefix: /
    args:
      default_model: {{ $fe.defaultModel | quote }}
      max_texts_per_request: {{ $fe.maxTextsPerRequest }}
      max_body_bytes: {{ $fe.maxBodyBytes | int64 }}
      max_chars_per_text: {{ $fe.maxCharsPerText }}
      triton_grpc_url: {{ include "infergate.tritonGrpcAddress" . | quote }}
      triton_timeout_s: {{ $fe.tritonTimeoutS }}
      # The replicas ask the control plane to load a version Triton does not have when
      # the control plane may unload one (triton.maxLoadedVersions, triton.idleUnloadS).
      load_on_demand: {{ include "infergate.loadsOnDemand" . }}
      cold_start_timeout_s: {{ $fe.coldStartTimeoutS }}
      batch_max_rows: {{ min $fe.batchMaxRows .Values.triton.maxBatchSize }}
      batch_max_in_flight: {{ $fe.batchMaxInFlight }}
      batch_full_calls_ahead: {{ $fe.batchFullCallsAhead }}
      tracking_uri: {{ include "infergate.mlflowUrl" . | quote }}
      {{- if .Values.prometheus.enabled }}
      # GET /tei/{model}/metrics: the model's series, federated by this chart's Prometheus.
      metrics_federate_url: {{ printf "http://%s:9090/federate" (include "infergate.prometheusName" .) | quote }}
      {{- end }}
      artifact_cache_dir: /tmp/infergate/artifacts
      {{- if $fe.apiKeys.enabled }}
      # Mounted from the API keys Secret on every Ray pod (infergate.apiKeysVolume).
      api_keys_file: {{ include "infergate.apiKeysFile" . | quote }}
      {{- end }}
      {{- with $fe.payloads }}
      payloads:
        enabled: {{ .enabled }}
        url: {{ .url | default "/tmp/infergate/payloads" | quote }}
        max_total_mb: {{ .maxTotalMb }}
        texts: {{ .texts | quote }}
        {{- with .redactModel }}
        redact_model: {{ . | quote }}
        {{- end }}
        sample:
          champion: {{ .sample.champion }}
          canary: {{ .sample.canary }}
          shadow: {{ .sample.shadow }}
        flush_interval_s: {{ .flushIntervalS }}
        flush_records: {{ .flushRecords | int }}
      {{- end }}
    deployments:
      - name: frontend
        max_ongoing_requests: {{ $fe.maxOngoingRequests }}
        autoscaling_config:
          min_replicas: {{ $fe.autoscaling.minReplicas }}
          max_replicas: {{ $fe.autoscaling.maxReplicas }}
          target_ongoing_requests: {{ $fe.autoscaling.targetOngoingRequests }}
        ray_actor_options:
          num_cpus: {{ $fe.replicaCpus }}
        logging_config:
          enable_access_log: {{ $fe.accessLog }}
{{- end }}

{{/*
Environment of every Ray container.
*/}}
{{- define "infergate.rayEnv" -}}
# Replicas tokenize a batch on the calling thread (infergate.serving.tokenization).
- name: TOKENIZERS_PARALLELISM
  value: "false"
{{- include "infergate.mlflowClientEnv" . | nindent 0 }}
{{- include "infergate.apiKeysEnv" . | nindent 0 }}
{{- if .Values.frontend.grpcPort }}
# The largest gRPC message a replica reads: a REST body's limit and 64 KiB of framing
# (infergate.stack.ray_start.grpc_message_limit); Ray Serve's own limit is 2 GiB.
- name: RAY_SERVE_GRPC_MAX_MESSAGE_SIZE
  value: {{ add .Values.frontend.maxBodyBytes 65536 | quote }}
{{- end }}
{{- if .Values.frontend.fastIngress }}
# HAProxy ingress and throughput-optimised mode of Ray Serve.
- name: RAY_SERVE_ENABLE_HA_PROXY
  value: "1"
- name: RAY_SERVE_THROUGHPUT_OPTIMIZED
  value: "1"
# No per-request log lines parsed into Ray's HTTP metrics; infergate_requests_total counts.
- name: RAY_SERVE_HAPROXY_METRICS_ENABLED
  value: "0"
- name: RAY_SERVE_HAPROXY_METRICS_PORT
  value: {{ .Values.frontend.haproxyMetricsPort | quote }}
# Client connections the ingress holds at once, and how long one may send nothing.
- name: RAY_SERVE_HAPROXY_MAXCONN
  value: {{ .Values.frontend.maxConnections | quote }}
- name: RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S
  value: {{ .Values.frontend.clientIdleTimeoutS | quote }}
{{- end }}
{{- end }}

{{/*
Ports every Ray pod serves: Serve's HTTP ingress (a proxy on every node), its gRPC ingress,
Ray's metrics agent and HAProxy's metrics. Prometheus finds its targets by these port numbers.
*/}}
{{- define "infergate.rayPorts" -}}
- name: serve
  containerPort: {{ include "infergate.servePort" . }}
- name: metrics
  containerPort: {{ .Values.ray.metricsExportPort }}
{{- if .Values.frontend.grpcPort }}
- name: grpc
  containerPort: {{ .Values.frontend.grpcPort }}
{{- end }}
{{- if .Values.frontend.fastIngress }}
- name: haproxy-metrics
  containerPort: {{ .Values.frontend.haproxyMetricsPort }}
{{- end }}
{{- end }}
