import type { IncomingMessage } from 'node:http'
import type { ProblemDetails } from '@oncely/protocol'
import { payloadTooLarge } from './request.js'

/** A request body read as text, or the problem that refuses it. */
export type ReadBody = { ok: true; text: string } | { ok: false; problem: ProblemDetails }

/**
 * Reads a Node request's body as UTF-8, refusing it with 413 as soon as it exceeds `limit` bytes (whatever its
 * `Content-Length` claimed); the rest is drained unread so the connection can answer.
 */
export function readNodeBody(request: IncomingMessage, limit: number): Promise<ReadBody> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    let tooLarge = false
    request.on('data', (chunk: Buffer) => {
      if (tooLarge) return
      size += chunk.length
      if (size > limit) {
        tooLarge = true
        chunks.length = 0
        resolve({ ok: false, problem: payloadTooLarge() })
        return
      }
      chunks.push(chunk)
    })
    request.once('end', () => {
      if (!tooLarge) resolve({ ok: true, text: Buffer.concat(chunks).toString('utf8') })
    })
    request.once('error', reject)
    request.once('close', () => {
      if (!request.readableEnded)
        reject(new Error('The client closed the connection before sending its body.'))
    })
  })
}
