import { migrate, postgresStore } from '@oncely/server'
import { instrumentEngine } from '@oncely/server/otel'
import { context, propagation } from '@opentelemetry/api'
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks'
import { ExportResultCode, W3CTraceContextPropagator } from '@opentelemetry/core'
import {
  AggregationTemporality,
  MeterProvider,
  PeriodicExportingMetricReader,
  type PushMetricExporter,
} from '@opentelemetry/sdk-metrics'
import {
  AlwaysOnSampler,
  BatchSpanProcessor,
  type SpanExporter,
  TraceIdRatioBasedSampler,
  TracerProvider,
} from '@opentelemetry/sdk-trace'
import { benchEngine } from './engines.js'
import { ledgerRoute, ONCELY_SCHEMA } from './oncely.js'
import type { Variant } from './variant.js'

/** Exporters that take everything and keep nothing: the SDK's work is measured, not a collector's. */
const spans: SpanExporter = {
  export: (_spans, done) => done({ code: ExportResultCode.SUCCESS }),
  shutdown: async () => {},
}
const metricsSink: PushMetricExporter = {
  export: (_metrics, done) => done({ code: ExportResultCode.SUCCESS }),
  forceFlush: async () => {},
  shutdown: async () => {},
  selectAggregationTemporality: () => AggregationTemporality.CUMULATIVE,
}

/**
 * An SDK that records every metric and samples every span (or the given ratio of them) into exporters that keep
 * nothing, so what is measured is the SDK's work and the instrumentation's, not a collector's.
 */
export function recordingTelemetry(spanRatio = 1) {
  const tracerProvider = new TracerProvider({
    sampler: spanRatio >= 1 ? new AlwaysOnSampler() : new TraceIdRatioBasedSampler(spanRatio),
    spanProcessors: [new BatchSpanProcessor({ exporter: spans })],
  })
  const meterProvider = new MeterProvider({
    readers: [new PeriodicExportingMetricReader({ exporter: metricsSink, exportIntervalMillis: 10_000 })],
  })
  return {
    tracerProvider,
    meterProvider,
    close: async () => {
      await tracerProvider.shutdown()
      await meterProvider.shutdown()
    },
  }
}

/**
 * The process-wide part of an OpenTelemetry setup, as the Node SDK installs it: the AsyncLocalStorage context manager
 * and the W3C propagator. The otel suite starts a server process of its own with it (BENCH_OTEL_CONTEXT=1), so the
 * other variants' numbers never carry its cost.
 */
export function registerOtelContext(): void {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable())
  propagation.setGlobalPropagator(new W3CTraceContextPropagator())
}

/**
 * `oncely-lock` with `@oncely/server/otel`: every execution sampled into a span (BatchSpanProcessor), every metric
 * recorded (a reader exporting every 10 s). With `sdk: false`, the instrumentation on the API's no-op providers.
 */
function variant(name: string, sdk: boolean): Variant {
  return {
    name,
    description: sdk
      ? "oncely (reservation: 'lock') instrumented with @oncely/server/otel, spans and metrics recorded by the OpenTelemetry SDK"
      : "oncely (reservation: 'lock') instrumented with @oncely/server/otel, no SDK registered",
    async setup(scope, { pool }) {
      await migrate(pool, { schema: ONCELY_SCHEMA })
      const engine = benchEngine(name, {
        store: postgresStore({ pool, schema: ONCELY_SCHEMA }),
        reservation: 'lock',
      })
      let close = async () => {}
      let telemetry = {}
      if (sdk) {
        const recording = recordingTelemetry()
        telemetry = recording
        close = recording.close
      }
      await ledgerRoute(scope, instrumentEngine(engine, telemetry))
      return close
    },
  }
}

export const oncelyOtel = variant('oncely-otel', true)
export const oncelyOtelNoop = variant('oncely-otel-noop', false)
