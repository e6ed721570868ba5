import type { Readable } from 'node:stream'

/**
 * Reads an onSend payload (string, Buffer, stream or nothing) into bytes: at once for all but a stream, so the
 * common response costs no promise.
 */
export function payloadBytes(payload: unknown): Buffer | Promise<Buffer> {
  if (payload === null || payload === undefined) return Buffer.alloc(0)
  if (Buffer.isBuffer(payload)) return payload
  if (typeof payload === 'string') return Buffer.from(payload, 'utf8')
  if (payload instanceof Uint8Array) return Buffer.from(payload)
  return streamBytes(payload as Readable)
}

async function streamBytes(stream: Readable): Promise<Buffer> {
  const chunks: Buffer[] = []
  for await (const chunk of stream) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
  return Buffer.concat(chunks)
}
