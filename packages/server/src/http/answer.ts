import type { ServerResponse } from 'node:http'
import {
  formatRetryAfter,
  IDEMPOTENT_REPLAYED_HEADER,
  PROBLEM_CONTENT_TYPE,
  type ProblemDetails,
  problem,
  RETRY_AFTER_HEADER,
} from '@oncely/protocol'
import type { Outcome, StoredResponse } from '../engine/types.js'

/** A response that replaces whatever the handler did: a replay, or a problem. */
export interface Replacement {
  status: number
  /** Lower-case names. */
  headers: Record<string, string>
  body: Buffer
  /** Adds `Idempotent-Replayed: true`. */
  replayed?: boolean
}

/** A replacement, as an {@link Answer}. */
export type ReplacingAnswer = { own: false } & Replacement

/** What the client gets: the handler's own response as it wrote it (`own`), or a replacement. */
export type Answer = { own: true } | ReplacingAnswer

const OWN: Answer = { own: true }
const REPLAYED = IDEMPOTENT_REPLAYED_HEADER.toLowerCase()
const RETRY_AFTER = RETRY_AFTER_HEADER.toLowerCase()

/**
 * Headers that describe the response they were set for, whoever set them: a replacement sets its own or has none.
 * Every other header set before the handler ran (a request id, CORS headers) stays on a replacement.
 */
const STALE_HEADERS = ['content-length', 'content-type', RETRY_AFTER]

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
  return { own: false, status: response.status, headers: response.headers, body: response.body, replayed }
}

/**
 * What the engine's outcome looks like on the wire. `responded` tells whether the handler's own response exists
 * (it ran and answered); when it does, an executed request gets exactly that response, with every header it set.
 * An outcome that carries a thrown retryable error rethrows it, for the framework's error handling.
 */
export function answerFor(outcome: Outcome, responded: boolean): Answer {
  switch (outcome.kind) {
    case 'executed':
      // A response too large to store was replaced by the stored problem: the client gets what a retry replays.
      return responded && !outcome.tooLarge ? OWN : stored(outcome.response, false)
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
    case 'lease_expired':
      return problemAnswer(
        problem(
          'lease_expired',
          'This attempt lost its hold on the key before it finished; nothing it did was committed. Retry with the same key.',
        ),
        outcome.retryAfterMs,
      )
    case 'retryable_failure':
      if (outcome.response) return responded ? OWN : stored(outcome.response, false)
      throw outcome.error
  }
}

/** A header's value on a Node response object. */
export type HeaderValue = string | number | readonly string[]

/** A response object's headers at one moment (lower-case names), to give them back later. */
export type HeaderSnapshot = Readonly<Record<string, HeaderValue>>

/**
 * How an adapter writes to its framework's response object, as plain functions of it (one object per adapter, so
 * writing an answer allocates nothing).
 */
export interface ResponseWriter<Response> {
  status(response: Response, code: number): void
  setHeader(response: Response, name: string, value: HeaderValue): void
  removeHeader(response: Response, name: string): void
  /** Every header set so far, lower-case names. */
  headers(response: Response): Record<string, HeaderValue | undefined>
}

/** Writes to Node's own `ServerResponse` (Express, and NestJS on its Express platform). */
export const nodeResponseWriter: ResponseWriter<ServerResponse> = {
  status: (res, code) => {
    res.statusCode = code
  },
  setHeader: (res, name, value) => res.setHeader(name, value),
  removeHeader: (res, name) => res.removeHeader(name),
  headers: (res) => res.getHeaders(),
}

/** What {@link replyWriter} needs of a Fastify reply (so that NestJS's Fastify platform needs no import of Fastify). */
export interface ReplyLike {
  raw: { removeHeader(name: string): void }
  code(status: number): unknown
  header(name: string, value: HeaderValue): unknown
  removeHeader(name: string): unknown
  getHeaders(): Record<string, HeaderValue | undefined>
}

/**
 * Writes to a Fastify reply. Fastify keeps the headers set through the reply in a map of its own until it writes the
 * head, and merges in those set on the raw response: a header is removed from both.
 */
export const replyWriter: ResponseWriter<ReplyLike> = {
  status: (reply, code) => reply.code(code),
  setHeader: (reply, name, value) => reply.header(name, value),
  removeHeader: (reply, name) => {
    reply.removeHeader(name)
    reply.raw.removeHeader(name)
  },
  headers: (reply) => reply.getHeaders(),
}

/** The response's headers now: taken just before the handler runs, so that what it sets can be taken back. */
export function snapshotHeaders<R>(writer: ResponseWriter<R>, response: R): HeaderSnapshot {
  const snapshot: Record<string, HeaderValue> = {}
  for (const [name, value] of Object.entries(writer.headers(response))) {
    if (value !== undefined) snapshot[name] = Array.isArray(value) ? [...value] : value
  }
  return snapshot
}

const sameValue = (a: HeaderValue | undefined, b: HeaderValue): boolean =>
  Array.isArray(a) && Array.isArray(b)
    ? a.length === b.length && a.every((value, i) => value === b[i])
    : a === b

/**
 * Takes back what the handler did to the response's headers before an answer replaces its response (a replay, a
 * problem, or an error page after it threw): every header it set goes, every header it changed gets its earlier
 * value back, so the answer carries nothing of an attempt that never committed (its `Set-Cookie` least of all).
 * `before` is the snapshot taken when the handler started, `undefined` when it never ran. Headers set before that
 * stay, but for those that describe a response (`Content-Length`, `Content-Type`, `Retry-After`).
 */
export function resetHandlerHeaders<R>(
  writer: ResponseWriter<R>,
  response: R,
  before: HeaderSnapshot | undefined,
): void {
  if (before) {
    const now = writer.headers(response)
    for (const name of Object.keys(now)) {
      if (!(name in before)) writer.removeHeader(response, name)
    }
    for (const [name, value] of Object.entries(before)) {
      if (sameValue(now[name], value)) continue
      writer.removeHeader(response, name)
      writer.setHeader(response, name, value)
    }
  }
  for (const name of STALE_HEADERS) writer.removeHeader(response, name)
}

/**
 * Writes a replacement's status and headers to a response the handler may already have touched, taking back what
 * the handler set (see {@link resetHandlerHeaders}; headers set by earlier hooks, such as a request id, stay), and
 * returns the body to send.
 */
export function writeReplacement<R>(
  writer: ResponseWriter<R>,
  response: R,
  answer: Replacement,
  before: HeaderSnapshot | undefined,
): Buffer {
  resetHandlerHeaders(writer, response, before)
  writer.status(response, answer.status)
  for (const name in answer.headers) writer.setHeader(response, name, answer.headers[name]!)
  if (answer.replayed) writer.setHeader(response, REPLAYED, 'true')
  return answer.body
}

/** A replacement's headers as one object, for a response built from scratch (the Fetch API's). */
export function replacementHeaders(answer: Replacement): Record<string, string> {
  return answer.replayed ? { ...answer.headers, [REPLAYED]: 'true' } : answer.headers
}
