import type { Engine, ErrorClass } from '../engine/types.js'
import { type ConsumeResult, createInbox, type MessageContext } from '../inbox/inbox.js'

/** Options of {@link createJobs}. */
export interface JobsOptions {
  engine: Engine
  /** The records' scope, separating jobs from other users of the engine's table. @default 'jobs' */
  scope?: string
  /**
   * How long a run is remembered. Longer than any late or replayed trigger of the same occurrence (a scheduler
   * catching up after downtime, a cron restored from backup).
   * @default 2_592_000_000 (30 days)
   */
  retentionMs?: number
  /** How long a run owns its occurrence before another trigger may take it over. Above the job's p99. @default the engine's */
  leaseMs?: number
  /** Which job errors are permanent (stored, never re-run) rather than retryable. @default () => 'retryable' */
  classify?: (error: unknown) => ErrorClass
}

/** One occurrence of a scheduled job. */
export interface RunOnceInput<T> {
  /** The job's stable name, such as `nightly-invoices`. */
  jobId: string
  /** The occurrence: the time the schedule said it should run (not the time it actually started). */
  scheduledFor: Date
  /** The work, on `ctx.tx`; its return value (JSON) is stored and returned to later triggers. */
  handler: (ctx: MessageContext) => Promise<T>
}

/** Runs scheduled jobs at most once per occurrence. Create with {@link createJobs}. */
export interface Jobs {
  /**
   * Runs the occurrence `(jobId, scheduledFor)` unless it already ran: `processed` (ran now), `duplicate` (ran
   * before; `result` is what it returned), `busy` (running elsewhere), or a failure to retry later.
   */
  runOnce<T = unknown>(input: RunOnceInput<T>): Promise<ConsumeResult<T>>
}

/**
 * Scheduled jobs on the engine: key = job id + scheduled time, so an at-least-once scheduler (several instances
 * firing the same cron, a retry after a crash) runs each occurrence once, with its effects in the same transaction
 * as the record.
 *
 * @example
 * const jobs = createJobs({ engine })
 * cron.schedule('0 2 * * *', (scheduledFor) =>
 *   jobs.runOnce({ jobId: 'nightly-invoices', scheduledFor, handler: ({ tx }) => issueInvoices(tx) }))
 */
export function createJobs(options: JobsOptions): Jobs {
  if (typeof options !== 'object' || options === null)
    throw new TypeError('Expected `options` to be an object.')
  const inbox = createInbox({
    engine: options.engine,
    consumer: options.scope ?? 'jobs',
    retentionMs: options.retentionMs ?? 2_592_000_000,
    ...(options.leaseMs === undefined ? {} : { leaseMs: options.leaseMs }),
    ...(options.classify === undefined ? {} : { classify: options.classify }),
  })
  return {
    runOnce(input) {
      if (typeof input?.jobId !== 'string' || input.jobId === '') {
        throw new TypeError('Expected `jobId` to be a non-empty string.')
      }
      if (!(input.scheduledFor instanceof Date) || Number.isNaN(input.scheduledFor.getTime())) {
        throw new TypeError('Expected `scheduledFor` to be a valid Date.')
      }
      return inbox.consume({
        messageId: input.scheduledFor.toISOString(),
        topic: input.jobId,
        handler: input.handler,
      })
    },
  }
}
