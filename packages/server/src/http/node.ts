import type { IncomingMessage, ServerResponse } from 'node:http'
import { Readable } from 'node:stream'
import type { ReadableStream as NodeReadableStream } from 'node:stream/web'
import type { ProblemDetails } from '@oncely/protocol'
import { problemAnswer, type ReplacingAnswer } from './answer.js'
import type { Exchange } from './core.js'
import type { AdapterLogger, ResolvedRoute } from './options.js'
import { bodyOf, earlyRefusal, type RequestPolicy } from './policy.js'
import { type ChunkSource, refuse } from './refusal.js'
import {
  announcesBody,
  DEFAULT_MAX_BODY_BYTES,
  decodePath,
  type HeaderReader,
  isSafeMethod,
  payloadTooLarge,
  targetPath,
  targetQuery,
} from './request.js'

const NO_BYTES = new Uint8Array(0)

/** A request body as the bytes received (decoded by `parseBody`), or the problem that refuses it. */
export type ReadBody = { ok: true; bytes: Buffer } | { ok: false; problem: ProblemDetails }

/**
 * Reads a Node request's body as bytes, refusing it with 413 as soon as it exceeds `limit` bytes (whatever its
 * `Content-Length` claimed). The rest is left unread: answer with {@link sendRefusal}, which discards it within
 * bounds.
 */
export function readNodeBody(request: IncomingMessage, limit: number): Promise<ReadBody> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    const onData = (chunk: Buffer) => {
      size += chunk.length
      if (size > limit) {
        request.off('data', onData)
        request.pause()
        chunks.length = 0
        resolve({ ok: false, problem: payloadTooLarge() })
        return
      }
      chunks.push(chunk)
    }
    request.on('data', onData)
    request.once('end', () => resolve({ ok: true, bytes: Buffer.concat(chunks, size) }))
    request.once('error', reject)
    request.once('close', () => {
      if (!request.readableEnded)
        reject(new Error('The client closed the connection before sending its body.'))
    })
  })
}

/**
 * The rest of a Node request's body, chunk by chunk, or undefined once it was read to its end. Whatever it was piped
 * to (a decompressing stream of a Fastify preParsing hook) is cut off first: the rest goes nowhere.
 */
export function nodeChunks(request: IncomingMessage): ChunkSource | undefined {
  if (request.readableEnded) return undefined
  request.unpipe()
  const chunks = request[Symbol.asyncIterator]()
  return () => chunks.next()
}

/**
 * Sends `answer` to a request whose body is not read to its end, then closes the connection once the rest of the
 * body was discarded (see `refuse`).
 */
export function sendRefusal(
  request: IncomingMessage,
  response: ServerResponse,
  answer: ReplacingAnswer,
): void {
  const refusal = refuse(answer, nodeChunks(request))
  response.writeHead(refusal.status, refusal.headers)
  Readable.fromWeb(refusal.body as NodeReadableStream<Uint8Array>).pipe(response)
}

/** A Node request's body as the policy admits it (see `policy.ts`). */
export type NodeBody =
  | { ok: true; body: unknown }
  /** Refused before the body was read to its end: send with {@link sendRefusal}. */
  | { ok: false; refusal: ReplacingAnswer }
  /** Refused once the body was read: send as any answer. */
  | { ok: false; answer: ReplacingAnswer }

/**
 * Reads and parses a Node request's JSON body as every adapter over Node's `IncomingMessage` must: refused from
 * its headers first, then past `limit` while it is read, then as JSON; a body another parser already read is
 * `consumed()`'s answer.
 */
export async function readNodeJson(
  request: IncomingMessage,
  header: HeaderReader,
  limit: number,
  consumed: () => ReplacingAnswer,
): Promise<NodeBody> {
  const early = earlyRefusal(header, limit)
  if (early) return { ok: false, refusal: early }
  let bytes: Uint8Array = NO_BYTES
  if (!request.readableEnded) {
    const read = await readNodeBody(request, limit)
    if (!read.ok) return { ok: false, refusal: problemAnswer(read.problem) }
    bytes = read.bytes
  } else if (announcesBody(header)) {
    // Another parser read the body: its bytes are gone, and with them the strict checks.
    return { ok: false, answer: consumed() }
  }
  // An empty body with a JSON content type is 400, as without a parser in front (which would make it {}).
  return bodyOf(bytes, header)
}

/** A Node request target (`req.originalUrl`) as the core reads it: the decoded path, and the query when asked. */
export function nodeTarget(target: string): { path: string; query: () => Record<string, unknown> } {
  return { path: decodePath(targetPath(target)), query: () => targetQuery(target) }
}

/** What a Node framework (Express, Koa) tells {@link nodeAdmission} of one request on an idempotent route. */
export interface NodeRequest {
  /** Node's request, whose body is read. */
  raw: IncomingMessage
  /** Upper-case. */
  method: string
  /** The request target as the router saw it (`originalUrl`). */
  target: string
  /** The route template the router matched, if it names one. */
  template: string | undefined
  /** Names the route in the log, such as `POST /v1/payments`. */
  where: () => string
  /** Puts the parsed body where the framework's handlers read it, before the core runs. */
  received: (body: unknown) => void
}

/** The part of an exchange a Node request gives (see `Exchange`), once admitted. */
export type NodeExchange = Pick<Exchange, 'method' | 'route' | 'path' | 'query' | 'header' | 'body'>

/** A Node request as the policy admits it, for the core, or refused (see {@link NodeBody}). */
export type NodeAdmission = { ok: true; exchange: NodeExchange } | Exclude<NodeBody, { ok: true }>

/**
 * What the policy of every adapter admits of a request, for an adapter that serves Node's requests from a route's
 * handler or middleware (Express, Koa): a safe method is refused, the body read and parsed strictly (see
 * {@link readNodeJson}), and a route that names no template and no `operation` refused as misplaced. `fixes` says
 * in the adapter's terms how to mount a body parser that read the body first, and how to name the operation.
 */
export function nodeAdmission(
  policy: RequestPolicy,
  log: AdapterLogger,
  fixes: { consumed: string; misplaced: string },
): (route: ResolvedRoute, request: NodeRequest) => Promise<NodeAdmission> {
  return async (route, request) => {
    const { method, template, where } = request
    if (isSafeMethod(method)) return { ok: false, answer: policy.safeMethod(method, where(), log) }
    const header: HeaderReader = (name) => request.raw.headers[name]
    const limit = route.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES
    const read = await readNodeJson(request.raw, header, limit, () =>
      policy.bodyConsumed(where(), fixes.consumed, log),
    )
    if (!read.ok) return read
    const { body } = read
    request.received(body)
    if (template === undefined && route.operation === undefined) {
      return { ok: false, answer: policy.misplaced(where(), fixes.misplaced, log) }
    }
    const exchange = { method, route: template ?? (route.operation as string), header, body }
    return { ok: true, exchange: { ...exchange, ...nodeTarget(request.target) } }
  }
}
