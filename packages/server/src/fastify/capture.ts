import type { Readable } from 'node:stream'

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
