/**
 * Just enough HTTP/1.1 request framing for the fault proxy: where one request ends in a byte stream, so a fault can
 * hit one request of a keep-alive connection and a duplicate can carry exactly one request. Clients do not
 * pipeline, so at most one request per connection is outstanding.
 */

/** A complete request's bytes and its request line, for the history. */
export interface FramedRequest {
  bytes: Buffer
  /** `POST /v1/payments` */
  line: string
}

const HEADER_END = Buffer.from('\r\n\r\n')
const MAX_HEADER_BYTES = 64 * 1024

/** Accumulates bytes and yields complete requests. Chunked request bodies are not supported (fetch does not send them for string bodies). */
export class RequestFramer {
  #buffer: Buffer = Buffer.alloc(0)

  /** Feeds bytes; returns the requests completed by them. Throws on a request it cannot frame. */
  push(chunk: Buffer): FramedRequest[] {
    this.#buffer = this.#buffer.length === 0 ? chunk : Buffer.concat([this.#buffer, chunk])
    const requests: FramedRequest[] = []
    for (;;) {
      const end = this.#buffer.indexOf(HEADER_END)
      if (end < 0) {
        if (this.#buffer.length > MAX_HEADER_BYTES) throw new Error('request headers exceed 64 KiB')
        return requests
      }
      const head = this.#buffer.subarray(0, end).toString('latin1')
      const [line = '', ...headers] = head.split('\r\n')
      let length = 0
      for (const header of headers) {
        const colon = header.indexOf(':')
        const name = header.slice(0, colon).trim().toLowerCase()
        const value = header.slice(colon + 1).trim()
        if (name === 'transfer-encoding' && value.toLowerCase() !== 'identity') {
          throw new Error(`cannot frame Transfer-Encoding: ${value}`)
        }
        if (name === 'content-length') length = Number.parseInt(value, 10)
      }
      const total = end + HEADER_END.length + length
      if (this.#buffer.length < total) return requests
      const bytes = this.#buffer.subarray(0, total)
      this.#buffer = this.#buffer.subarray(total)
      requests.push({ bytes, line: line.split(' ').slice(0, 2).join(' ') })
    }
  }
}
