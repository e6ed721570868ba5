import type { ErrorClass, HandlerResponse } from './types.js'

function httpStatusOf(error: unknown): number | undefined {
  if (typeof error !== 'object' || error === null) return undefined
  const candidate = error as { statusCode?: unknown; status?: unknown }
  const status = candidate.statusCode ?? candidate.status
  return typeof status === 'number' && Number.isInteger(status) ? status : undefined
}

/**
 * The default classification of a thrown error: an HTTP 4xx (`statusCode` or `status`, as http-errors and Fastify
 * errors carry) is a permanent business rejection; everything else (5xx, timeouts, network errors, Postgres
 * serialization failures 40001 and deadlocks 40P01, unknown errors) is retryable, because re-executing a failed
 * attempt whose writes were rolled back is safe and storing a transient failure forever is not.
 */
export function defaultClassify(error: unknown): ErrorClass {
  const status = httpStatusOf(error)
  return status !== undefined && status >= 400 && status < 500 ? 'permanent' : 'retryable'
}

/** Renders a permanent error as `{ statusCode, code, error, message }` JSON, the shape Fastify's errors have. */
export function defaultRenderError(error: unknown): HandlerResponse {
  const status = httpStatusOf(error) ?? 400
  const e = error as { code?: unknown; name?: unknown; message?: unknown }
  return {
    status,
    headers: { 'content-type': 'application/json; charset=utf-8' },
    body: {
      statusCode: status,
      ...(typeof e?.code === 'string' ? { code: e.code } : {}),
      error: typeof e?.name === 'string' ? e.name : 'Error',
      message: typeof e?.message === 'string' ? e.message : String(error),
    },
  }
}
