import type { PoolClient } from 'pg'
import type { Engine, ErrorClass } from '../engine/types.js'
import { type ConsumeResult, createInbox, type MessageContext } from '../inbox/inbox.js'
import { nonEmptyString, objectOptions, positiveInteger } from '../options/check.js'

/** Options of {@link createJobs}. */
export interface JobsOptions<Tx = PoolClient> {
  /**
   * The engine whose table records runs. Give it `reservation: 'lock'`: an occurrence then belongs to a run only
   * while its transaction lives, so when the process running it dies the next trigger runs it at once; under
   * `'row'` it answers `busy` until the dead run's lease runs out.
   */
  engine: Engine<Tx>
  /** The records' scope, separating jobs from other users of the engine's table. @default 'jobs' */
  scope?: string
  /**
   * How long a run is remembered. Longer than any late or replayed trigger of the same occurrence (a scheduler
   * catching up after downtime, a cron restored from backup).
   * @default 2_592_000_000 (30 days)
   */
  retentionMs?: number
  /**
   * Under the engine's `reservation: 'row'`: how long a run owns its occurrence before another trigger may take it
   * over (above the job's p99). Not used under `'lock'`.
   * @default the engine's
   */
  leaseMs?: number
  /** Which job errors are permanent (stored, never re-run) rather than retryable. @default () => 'retryable' */
  classify?: (error: unknown) => ErrorClass
  /**
   * The width of a slot, in ms: `scheduledFor` is truncated to a multiple of it (from the Unix epoch), so triggers
   * of one occurrence that carry slightly different times (a scheduler's jitter, another instance's clock) are one
   * run. The default suits cron schedules (at most one occurrence per minute); a job that runs every 10 s needs
   * `slotMs: 10_000` or less, and one that names its slots (`slot`) ignores it.
   * @default 60_000
   */
  slotMs?: number
}

/** One occurrence of a scheduled job: name it with `slot`, or give its time as `scheduledFor`. */
export type RunOnceInput<T, Tx = PoolClient> = {
  /** The job's stable name, such as `nightly-invoices`. */
  jobId: string
  /** The work, on `ctx.tx`; its return value (JSON) is stored and returned to later triggers. */
  handler: (ctx: MessageContext<Tx>) => Promise<T>
} & (
  | {
      /**
       * The occurrence: the time the schedule said it should run (not the time it actually started), truncated to
       * `slotMs`, so `02:00:00.000` and `02:00:00.001` are the same run.
       */
      scheduledFor: Date
      slot?: undefined
    }
  | {
      /** The occurrence, named by you: `2026-01-05` for a nightly job, `invoice-run-42`. Used exactly as given. */
      slot: string
      scheduledFor?: undefined
    }
)

/** The record key of an occurrence: the caller's slot, or the ISO time truncated to `slotMs`. */
function slotKey(input: Omit<RunOnceInput<unknown>, 'handler'>, slotMs: number): string {
  if (input.slot !== undefined) {
    nonEmptyString('slot', input.slot)
    if (input.scheduledFor !== undefined) throw new TypeError('Expected `slot` or `scheduledFor`, not both.')
    return input.slot
  }
  if (!(input.scheduledFor instanceof Date) || Number.isNaN(input.scheduledFor.getTime())) {
    throw new TypeError('Expected `scheduledFor` to be a valid Date (or `slot` to be a string).')
  }
  const time = input.scheduledFor.getTime()
  return new Date(time - (((time % slotMs) + slotMs) % slotMs)).toISOString()
}

/** Runs scheduled jobs at most once per occurrence. Create with {@link createJobs}. */
export interface Jobs<Tx = PoolClient> {
  /**
   * Runs the occurrence `(jobId, slot)` unless it already ran: `processed` (ran now), `duplicate` (ran
   * before; `result` is what it returned), `busy` (running elsewhere), or a failure to retry later.
   */
  runOnce<T = unknown>(input: RunOnceInput<T, Tx>): Promise<ConsumeResult<T>>
}

/**
 * Scheduled jobs on the engine: key = job id + slot (the scheduled time truncated to `slotMs`, or a slot you name),
 * so an at-least-once scheduler (several instances firing the same cron, a retry after a crash) runs each
 * occurrence once, with its effects in the same transaction as the record.
 *
 * @example
 * const jobs = createJobs({ engine })
 * cron.schedule('0 2 * * *', (scheduledFor) =>
 *   jobs.runOnce({ jobId: 'nightly-invoices', scheduledFor, handler: ({ tx }) => issueInvoices(tx) }))
 */
export function createJobs<Tx = PoolClient>(options: JobsOptions<Tx>): Jobs<Tx> {
  objectOptions('createJobs()', options)
  const slotMs = positiveInteger('slotMs', options.slotMs ?? 60_000)
  const inbox = createInbox<Tx>({
    engine: options.engine,
    consumer: options.scope ?? 'jobs',
    retentionMs: options.retentionMs ?? 2_592_000_000,
    ...(options.leaseMs === undefined ? {} : { leaseMs: options.leaseMs }),
    ...(options.classify === undefined ? {} : { classify: options.classify }),
  })
  return {
    runOnce(input) {
      nonEmptyString('jobId', input?.jobId)
      return inbox.consume({
        messageId: slotKey(input, slotMs),
        topic: input.jobId,
        handler: input.handler,
      })
    },
  }
}
