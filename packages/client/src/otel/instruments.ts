import type { MeterProvider } from '@opentelemetry/api'
import { VERSION } from './version.js'

/** The instrumentation scope: the tracer and meter are named after the package and its version. */
export const INSTRUMENTATION_NAME = '@oncely/client'

// Buckets of the duration histograms, in seconds: sub-millisecond write-aheads up to minute-long Retry-After waits.
const SECONDS_BUCKETS = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
]

function instrumentsOf(provider: MeterProvider) {
  const meter = provider.getMeter(INSTRUMENTATION_NAME, VERSION)
  const count = (name: string, unit: string, description: string) =>
    meter.createCounter(name, { unit, description })
  const time = (name: string, description: string) =>
    meter.createHistogram(name, {
      unit: 's',
      description,
      advice: { explicitBucketBoundaries: SECONDS_BUCKETS },
    })
  return {
    attempts: count(
      'oncely.client.attempts',
      '{attempt}',
      'Attempts sent (each carries the same Idempotency-Key as the others of its intent).',
    ),
    retries: count(
      'oncely.client.retries',
      '{retry}',
      'Retries scheduled, by reason (`oncely.retry.reason`: `status 503`, `network`, ...).',
    ),
    retryDelay: time(
      'oncely.client.retry.delay',
      'Waits before a retry; `oncely.retry_after` is true when the server set it with Retry-After (409, 429, 503).',
    ),
    intents: count(
      'oncely.client.intents',
      '{intent}',
      'Intents that ended a run, by outcome (`oncely.outcome`: settled, failed, pending, expired).',
    ),
    resumes: count(
      'oncely.client.resumes',
      '{intent}',
      'Pending intents that resume() brought to an outcome, by outcome (settled, failed).',
    ),
    writeAhead: time(
      'oncely.client.write_ahead.duration',
      'Time from a request() call to its first byte: the durable write-ahead of the intent (and, for a named intent, its claim and read).',
    ),
    pending: meter.createObservableGauge('oncely.client.intents.pending', {
      description: 'Intents in the store not confirmed yet (pending, or expired with an unknown outcome).',
      unit: '{intent}',
    }),
  }
}

/** The client's instruments. */
export type Instruments = ReturnType<typeof instrumentsOf>

const byMeterProvider = new WeakMap<MeterProvider, Instruments>()

/** The instruments of `provider`, created once per provider. */
export function instrumentsFor(provider: MeterProvider): Instruments {
  let instruments = byMeterProvider.get(provider)
  if (!instruments) {
    instruments = instrumentsOf(provider)
    byMeterProvider.set(provider, instruments)
  }
  return instruments
}
