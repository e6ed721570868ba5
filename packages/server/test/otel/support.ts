import { context, propagation, type Tracer } from '@opentelemetry/api'
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks'
import { W3CTraceContextPropagator } from '@opentelemetry/core'
import {
  AggregationTemporality,
  DataPointType,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics'
import {
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
  TracerProvider,
} from '@opentelemetry/sdk-trace'

/**
 * An OpenTelemetry SDK for one test file, on the SDK's in-memory exporters: spans as they end, metrics on demand.
 * The context manager and the W3C propagator are installed globally (as the Node SDK does), the providers are not:
 * tests hand them to the instrumentation explicitly.
 */
export function testSdk() {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable())
  propagation.setGlobalPropagator(new W3CTraceContextPropagator())
  const spanExporter = new InMemorySpanExporter()
  const tracerProvider = new TracerProvider({
    spanProcessors: [new SimpleSpanProcessor({ exporter: spanExporter })],
  })
  const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE)
  const reader = new PeriodicExportingMetricReader({
    exporter: metricExporter,
    exportIntervalMillis: 3_600_000,
  })
  const meterProvider = new MeterProvider({ readers: [reader] })

  /** Every data point of `name` after a fresh collection, as `{ attributes, value }`. */
  async function points(
    name: string,
  ): Promise<Array<{ attributes: Record<string, unknown>; value: unknown }>> {
    metricExporter.reset()
    await reader.forceFlush()
    const out: Array<{ attributes: Record<string, unknown>; value: unknown }> = []
    for (const resource of metricExporter.getMetrics()) {
      for (const scope of resource.scopeMetrics) {
        for (const metric of scope.metrics) {
          if (metric.descriptor.name !== name) continue
          for (const point of metric.dataPoints) {
            const value =
              metric.dataPointType === DataPointType.HISTOGRAM
                ? (point.value as { count: number }).count
                : point.value
            out.push({ attributes: { ...point.attributes }, value })
          }
        }
      }
    }
    return out
  }

  /** The sum of the values (a histogram's: its counts) of the points of `name` whose attributes include `match`. */
  async function total(name: string, match: Record<string, unknown> = {}): Promise<number> {
    return (await points(name))
      .filter((p) => Object.entries(match).every(([k, v]) => p.attributes[k] === v))
      .reduce((sum, p) => sum + Number(p.value), 0)
  }

  return {
    tracerProvider,
    meterProvider,
    tracer: tracerProvider.getTracer('test') as Tracer,
    spans: (): ReadableSpan[] => spanExporter.getFinishedSpans(),
    resetSpans: () => spanExporter.reset(),
    points,
    total,
    async shutdown() {
      await tracerProvider.shutdown()
      await meterProvider.shutdown()
      context.disable()
      propagation.disable()
    },
  }
}

/** The span's parent span id (the SDK's field name changed across versions). */
export function parentOf(span: ReadableSpan): string | undefined {
  const s = span as ReadableSpan & { parentSpanId?: string; parentSpanContext?: { spanId: string } }
  return s.parentSpanContext?.spanId ?? s.parentSpanId
}
