import {
  formatRetryAfter,
  IDEMPOTENT_REPLAYED_HEADER,
  PROBLEM_CONTENT_TYPE,
  type ProblemDetails,
  RETRY_AFTER_HEADER,
} from '@oncely/protocol'
import type { FastifyReply } from 'fastify'
import { DEFAULT_REPLAY_HEADERS } from '../engine/response.js'
import type { StoredResponse } from '../engine/types.js'

/** Headers a handler may have set that must not leak into a different answer (a replay or a problem). */
const RESET_HEADERS = [...DEFAULT_REPLAY_HEADERS, 'content-length', RETRY_AFTER_HEADER.toLowerCase()]

/** Clears what the handler set, so an answer that replaces its response carries none of it. */
export function resetReply(reply: FastifyReply, stored?: StoredResponse): void {
  for (const name of RESET_HEADERS) reply.removeHeader(name)
  for (const name of Object.keys(stored?.headers ?? {})) reply.removeHeader(name)
}

/** Sets status and headers of a problem answer and returns its body. Problems are problem+json whatever `Accept` says. */
export function problemPayload(reply: FastifyReply, details: ProblemDetails, retryAfterMs?: number): Buffer {
  resetReply(reply)
  reply.code(details.status).header('content-type', PROBLEM_CONTENT_TYPE)
  if (retryAfterMs !== undefined) reply.header(RETRY_AFTER_HEADER, formatRetryAfter(retryAfterMs))
  return Buffer.from(JSON.stringify(details))
}

export function sendProblem(
  reply: FastifyReply,
  details: ProblemDetails,
  retryAfterMs?: number,
): FastifyReply {
  return reply.send(problemPayload(reply, details, retryAfterMs))
}

/** Sets status and headers of a stored response and returns its exact bytes. */
export function storedPayload(reply: FastifyReply, stored: StoredResponse, replayed: boolean): Buffer {
  resetReply(reply, stored)
  reply.code(stored.status)
  for (const [name, value] of Object.entries(stored.headers)) reply.header(name, value)
  if (replayed) reply.header(IDEMPOTENT_REPLAYED_HEADER, 'true')
  return stored.body
}
