/**
 * The demo's metrics: an OpenTelemetry MeterProvider of its own (not the global one, so several apps in one test
 * process do not mix), read by the Prometheus exporter at `GET /metrics` instead of on a port of its own.
 */
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus'
import { MeterProvider } from '@opentelemetry/sdk-metrics'
import type { FastifyInstance } from 'fastify'

export interface Metrics {
  meterProvider: MeterProvider
  exporter: PrometheusExporter
}

export function createMetrics(): Metrics {
  const exporter = new PrometheusExporter({ preventServerStart: true })
  return { exporter, meterProvider: new MeterProvider({ readers: [exporter] }) }
}

/** `GET /metrics`: every metric in the Prometheus text format (the oncely engine's `oncely_server_*` among them). */
export function registerMetricsRoute(app: FastifyInstance, metrics: Metrics): void {
  app.get('/metrics', { config: { public: true } }, async (request, reply) => {
    reply.hijack()
    metrics.exporter.getMetricsRequestHandler(request.raw, reply.raw)
  })
  app.addHook('onClose', async () => {
    await metrics.meterProvider.shutdown()
  })
}
