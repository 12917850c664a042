{{/*
Where each job of files/prometheus.yml finds its targets: a headless Service, which resolves
to the address of every ready pod behind it, and a port. A job the file adds without an entry
here fails the render; an entry with enabled false drops its job.
*/}}
{{- define "infergate.scrapeTargets" -}}
triton:
  service: {{ include "infergate.tritonHeadlessName" . }}
  port: {{ include "infergate.tritonMetricsPort" . }}
ray:
  service: {{ include "infergate.rayMetricsName" . }}
  port: {{ .Values.ray.metricsExportPort }}
ingress:
  enabled: {{ .Values.frontend.fastIngress }}
  service: {{ include "infergate.rayMetricsName" . }}
  port: {{ .Values.frontend.haproxyMetricsPort }}
{{- end }}

{{/*
deployments/prometheus.yml with DNS discovery through those Services instead of static targets.
*/}}
{{- define "infergate.prometheusConfig" -}}
{{- $config := .Files.Get "files/prometheus.yml" | fromYaml }}
{{- $targets := include "infergate.scrapeTargets" . | fromYaml }}
{{- $jobs := list }}
{{- range $job := $config.scrape_configs }}
{{- $target := get $targets $job.job_name }}
{{- if not $target }}
{{- fail (printf "files/prometheus.yml has a job %q that infergate.scrapeTargets does not place" $job.job_name) }}
{{- end }}
{{- if dig "enabled" true $target }}
{{- $_ := unset $job "static_configs" }}
{{- $name := printf "%s.%s.svc" $target.service $.Release.Namespace }}
{{- $_ := set $job "dns_sd_configs" (list (dict "names" (list $name) "type" "A" "port" (int $target.port))) }}
{{- $jobs = append $jobs $job }}
{{- end }}
{{- end }}
{{- $_ := set $config "scrape_configs" $jobs }}
{{- toYaml $config }}
{{- end }}
