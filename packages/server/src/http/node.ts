import type { IncomingMessage, ServerResponse } from 'node:http'
import { Readable } from 'node:stream'
import type { ReadableStream as NodeReadableStream } from 'node:stream/web'
import type { ProblemDetails } from '@oncely/protocol'
import type { ReplacingAnswer } from './answer.js'
import { type ChunkSource, refuse } from './refusal.js'
import { payloadTooLarge } from './request.js'

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
