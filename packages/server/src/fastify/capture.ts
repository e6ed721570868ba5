import type { Readable } from 'node:stream'
import type { Outcome, StoredResponse } from '../engine/types.js'

interface Deferred<T> {
  promise: Promise<T>
  resolve(value: T): void
  reject(error: unknown): void
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void
  let reject!: (error: unknown) => void
  const promise = new Promise<T>((res, rej) => {
    resolve = res
    reject = rej
  })
  // Either side may settle without the other listening (a handler that threw never reaches onSend).
  promise.catch(() => {})
  return { promise, resolve, reject }
}

/**
 * Holds a response between the handler's `reply.send()` and the wire. The onSend hook hands the serialized response
 * to the engine (`captured`) and then waits for the engine's decision (`decision`): only once the key record and the
 * business writes are committed does a byte leave, so a crash after the commit replays the same response and a
 * failed commit never reaches the client as a 2xx.
 */
export class ReplyCapture {
  /** True between the handler starting and its response being captured. */
  capturing = false
  /** True once the handler called `reply.send()` (directly or by returning a value). */
  sent = false
  readonly captured = deferred<StoredResponse>()
  readonly decision = deferred<Outcome>()
}

/** Reads an onSend payload (string, Buffer, stream or nothing) into bytes. */
export async function payloadBytes(payload: unknown): Promise<Buffer> {
  if (payload === null || payload === undefined) return Buffer.alloc(0)
  if (Buffer.isBuffer(payload)) return payload
  if (typeof payload === 'string') return Buffer.from(payload, 'utf8')
  if (payload instanceof Uint8Array) return Buffer.from(payload)
  const chunks: Buffer[] = []
  for await (const chunk of payload as Readable)
    chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
  return Buffer.concat(chunks)
}

/** A reply's headers as strings, lower-case names. */
export function headerStrings(headers: Record<string, unknown>): Record<string, string> {
  const out: Record<string, string> = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue
    out[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : String(value)
  }
  return out
}
