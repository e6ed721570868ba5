import type { IntentRecord } from './intent.js'

/** A request body the client can replay byte for byte. */
export type RequestBody = string | URLSearchParams | ArrayBuffer | ArrayBufferView | FormData

/** The encoded body and the content type it implies (unless the caller set one). */
export interface EncodedBody {
  body: IntentRecord['body']
  contentType: string | undefined
}

/**
 * Turns `json` or `body` into exact bytes that can be stored and resent. Streams and Blobs are refused: they can be
 * read only once or may be huge, so a resume could not send the same bytes.
 */
export async function encodeBody(json: unknown, body: unknown): Promise<EncodedBody> {
  if (json !== undefined) {
    if (body !== undefined) throw new TypeError('Pass either `json` or `body`, not both')
    return { body: { encoding: 'utf8', data: JSON.stringify(json) }, contentType: 'application/json' }
  }
  if (body === undefined || body === null) return { body: undefined, contentType: undefined }
  if (typeof body === 'string')
    return { body: { encoding: 'utf8', data: body }, contentType: 'text/plain;charset=UTF-8' }
  if (body instanceof URLSearchParams) {
    return {
      body: { encoding: 'utf8', data: body.toString() },
      contentType: 'application/x-www-form-urlencoded;charset=UTF-8',
    }
  }
  if (body instanceof ArrayBuffer) return { body: bytes(new Uint8Array(body)), contentType: undefined }
  if (ArrayBuffer.isView(body)) {
    return {
      body: bytes(new Uint8Array(body.buffer, body.byteOffset, body.byteLength)),
      contentType: undefined,
    }
  }
  if (typeof FormData !== 'undefined' && body instanceof FormData) {
    for (const [name, value] of body) {
      if (typeof value !== 'string') {
        throw new TypeError(
          `FormData field "${name}" holds a Blob/File; it cannot be stored and replayed byte for byte. Upload it separately and send its id.`,
        )
      }
    }
    // Let the runtime encode multipart once, so the stored bytes and boundary are what every attempt sends.
    const encoded = new Response(body)
    return {
      body: bytes(new Uint8Array(await encoded.arrayBuffer())),
      contentType: encoded.headers.get('content-type') ?? undefined,
    }
  }
  if (typeof ReadableStream !== 'undefined' && body instanceof ReadableStream) {
    throw new TypeError(
      'A ReadableStream body can be read only once and cannot be replayed; pass its bytes instead',
    )
  }
  if (typeof Blob !== 'undefined' && body instanceof Blob) {
    throw new TypeError('A Blob body cannot be stored for replay; pass `await blob.arrayBuffer()` instead')
  }
  throw new TypeError(
    `Unsupported body type ${Object.prototype.toString.call(body)}; use json, a string, URLSearchParams or bytes`,
  )
}

/** The stored body as what `fetch` sends. */
export function decodeBody(body: IntentRecord['body']): string | Uint8Array | undefined {
  if (!body) return undefined
  if (body.encoding === 'utf8') return body.data
  const binary = atob(body.data)
  const out = new Uint8Array(binary.length)
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i)
  return out
}

function bytes(view: Uint8Array): IntentRecord['body'] {
  let binary = ''
  // Chunked so large bodies do not exceed the argument limit of fromCharCode.
  for (let i = 0; i < view.length; i += 0x8000) {
    binary += String.fromCharCode(...view.subarray(i, i + 0x8000))
  }
  return { encoding: 'base64', data: btoa(binary) }
}
