import {
  formatRetryAfter,
  IDEMPOTENT_REPLAYED_HEADER,
  PROBLEM_CONTENT_TYPE,
  type ProblemDetails,
  problem,
  RETRY_AFTER_HEADER,
} from '@oncely/protocol'
import { DEFAULT_REPLAY_HEADERS } from '../engine/response.js'
import type { Outcome, StoredResponse } from '../engine/types.js'
import { isResponseTooLargeError } from '../errors.js'

/** A response that replaces whatever the handler did: a replay, or a problem. */
export interface Replacement {
  status: number
  /** Lower-case names. */
  headers: Record<string, string>
  body: Buffer
}

/** A replacement, as an {@link Answer}. */
export type ReplacingAnswer = { own: false } & Replacement

/** What the client gets: the handler's own response as it wrote it (`own`), or a replacement. */
export type Answer = { own: true } | ReplacingAnswer

const OWN: Answer = { own: true }
const REPLAYED = IDEMPOTENT_REPLAYED_HEADER.toLowerCase()
const RETRY_AFTER = RETRY_AFTER_HEADER.toLowerCase()

/** Headers a handler may have set that must not leak into a different answer (a replay or a problem). */
const RESET_HEADERS = [...DEFAULT_REPLAY_HEADERS, 'content-length', RETRY_AFTER]

/** A problem+json answer (whatever `Accept` says), with `Retry-After` when given. */
export function problemAnswer(details: ProblemDetails, retryAfterMs?: number): ReplacingAnswer {
  const headers: Record<string, string> = { 'content-type': PROBLEM_CONTENT_TYPE }
  if (retryAfterMs !== undefined) headers[RETRY_AFTER] = formatRetryAfter(retryAfterMs)
  return { own: false, status: details.status, headers, body: Buffer.from(JSON.stringify(details)) }
}

/**
 * A 500 for a server that is set up wrong. The client learns only that it is the server's fault (and may retry);
 * the cause and its fix go to the log.
 */
export function misconfiguredAnswer(detail: string): ReplacingAnswer {
  return problemAnswer({ type: 'about:blank', title: 'Internal Server Error', status: 500, detail })
}

function stored(response: StoredResponse, replayed: boolean): ReplacingAnswer {
  const headers = replayed ? { ...response.headers, [REPLAYED]: 'true' } : response.headers
  return { own: false, status: response.status, headers, body: response.body }
}

/**
 * What the engine's outcome looks like on the wire. `responded` tells whether the handler's own response exists
 * (it ran and answered); when it does, an executed request gets exactly that response, with every header it set.
 * An outcome that carries a thrown retryable error rethrows it, for the framework's error handling.
 */
export function answerFor(outcome: Outcome, responded: boolean): Answer {
  switch (outcome.kind) {
    case 'executed':
      return responded ? OWN : stored(outcome.response, false)
    case 'replayed':
      return stored(outcome.response, true)
    case 'in_progress':
      return problemAnswer(
        problem('request_in_progress', 'A request with this key is being processed; retry later.'),
        outcome.retryAfterMs,
      )
    case 'mismatch':
      return problemAnswer(
        problem('idempotency_key_reused', 'This key was already used with a different request.'),
      )
    case 'unavailable':
      return problemAnswer(
        problem('store_unavailable', 'The idempotency store is unavailable; retry later.'),
        outcome.retryAfterMs,
      )
    case 'retryable_failure':
      if (outcome.reason === 'response_too_large' && isResponseTooLargeError(outcome.error)) {
        return problemAnswer(problem('response_too_large', outcome.error.message))
      }
      if (outcome.response) return responded ? OWN : stored(outcome.response, false)
      throw outcome.error
  }
}

/** The few operations an adapter's response object offers to write a replacement. */
export interface ResponseTarget {
  status(code: number): void
  setHeader(name: string, value: string): void
  removeHeader(name: string): void
}

/** Removes the headers a handler set that describe its response (before an error page replaces that response). */
export function resetHandlerHeaders(target: ResponseTarget): void {
  for (const name of RESET_HEADERS) target.removeHeader(name)
}

/**
 * Writes a replacement's status and headers to a response the handler may already have touched, clearing what
 * the handler set that would contradict it (headers set by earlier hooks, such as a request id, stay), and
 * returns the body to send.
 */
export function writeReplacement(target: ResponseTarget, answer: Replacement): Buffer {
  resetHandlerHeaders(target)
  target.status(answer.status)
  for (const [name, value] of Object.entries(answer.headers)) target.setHeader(name, value)
  return answer.body
}

/** A response's headers as strings, lower-case names (a repeated header joined with commas). */
export function headerStrings(headers: Record<string, unknown>): Record<string, string> {
  const out: Record<string, string> = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue
    out[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : String(value)
  }
  return out
}
