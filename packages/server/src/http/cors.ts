import {
  ATTEMPT_HEADER,
  IDEMPOTENCY_KEY_HEADER,
  IDEMPOTENT_REPLAYED_HEADER,
  RETRY_AFTER_HEADER,
} from '@oncely/protocol'
import { headerNames, objectOptions } from '../options/check.js'

/** Your own headers, added to oncely's in {@link corsHeaders}. */
export interface CorsHeaderOptions {
  /**
   * Request headers your API takes besides oncely's, such as `Authorization`.
   * @default []
   * @example
   * corsHeaders({ allowedHeaders: ['Authorization'] })
   */
  allowedHeaders?: readonly string[]
  /**
   * Response headers your browser code reads besides oncely's, such as `Location`.
   * @default []
   * @example
   * corsHeaders({ exposedHeaders: ['Location'] })
   */
  exposedHeaders?: readonly string[]
}

/** The two header lists of a CORS set-up, under the names @fastify/cors and cors give them. */
export interface CorsHeaders {
  /** `Access-Control-Allow-Headers`: `Content-Type`, `Idempotency-Key` and `Oncely-Attempt`, then yours. */
  allowedHeaders: string[]
  /** `Access-Control-Expose-Headers`: `Idempotent-Replayed` and `Retry-After`, then yours. */
  exposedHeaders: string[]
}

// What the client sends that is not CORS-safelisted, so a preflight must allow it: the JSON content type, the key and
// the attempt number. Without the attempt header the browser refuses every attempt before it is sent.
const ALLOWED = ['Content-Type', IDEMPOTENCY_KEY_HEADER, ATTEMPT_HEADER]
// What the client reads that is not CORS-safelisted, so it is invisible to the page unless exposed: whether an
// answer is a replay, and how long to wait before trying again.
const EXPOSED = [IDEMPOTENT_REPLAYED_HEADER, RETRY_AFTER_HEADER]

function merged(option: keyof CorsHeaderOptions, ours: readonly string[], yours: unknown): string[] {
  if (yours === undefined) return [...ours]
  const names = headerNames(option, yours, { of: 'corsHeaders()' })
  const seen = new Set(ours.map((name) => name.toLowerCase()))
  const out = [...ours]
  for (const name of names) {
    if (seen.has(name.toLowerCase())) continue
    seen.add(name.toLowerCase())
    out.push(name)
  }
  return out
}

/**
 * The headers a CORS set-up must allow and expose for a browser client of oncely on another origin, with your own
 * added (case-insensitively once each). Spread it into @fastify/cors or cors; give its lists to hono/cors as
 * `allowHeaders` and `exposeHeaders`.
 *
 * @example
 * await app.register(cors, { origin: 'https://shop.example', ...corsHeaders({ allowedHeaders: ['Authorization'] }) })
 */
export function corsHeaders(options: CorsHeaderOptions = {}): CorsHeaders {
  objectOptions('corsHeaders()', options)
  return {
    allowedHeaders: merged('allowedHeaders', ALLOWED, options.allowedHeaders),
    exposedHeaders: merged('exposedHeaders', EXPOSED, options.exposedHeaders),
  }
}
