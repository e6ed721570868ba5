import type { OutgoingHttpHeaders, ServerResponse } from 'node:http'
import { headerStrings } from './answer.js'

/** A response as it was written to a Node response object and held back from the wire. */
export interface WrittenResponse {
  status: number
  /** Lower-case names. */
  headers: Record<string, string>
  body: Buffer
}

/**
 * What `res.writeHead(status, [message], [headers])` asks for, kept on `res` without writing anything: the status, the
 * message and the headers (an object, or a flat or nested array of pairs), for a hold that writes the head later.
 */
export function keepWriteHead(res: ServerResponse, status: number, rest: unknown[]): ServerResponse {
  res.statusCode = status
  if (typeof rest[0] === 'string') res.statusMessage = rest.shift() as string
  const headers = rest[0] as OutgoingHttpHeaders | readonly unknown[] | undefined
  if (Array.isArray(headers)) {
    // Either [name, value, name, value] or [[name, value], ...].
    const pairs = Array.isArray(headers[0])
      ? headers
      : headers.flatMap((_, i) => (i % 2 ? [] : [[headers[i], headers[i + 1]]]))
    for (const [name, value] of pairs as [string, string][]) res.setHeader(name, value)
  } else if (headers) {
    for (const [name, value] of Object.entries(headers)) {
      if (value !== undefined && value !== null) res.setHeader(name, value as string | number | string[])
    }
  }
  return res
}

type Chunk = string | Uint8Array
const toBuffer = (chunk: Chunk, encoding?: unknown): Buffer =>
  typeof chunk === 'string'
    ? Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8')
    : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength)

/**
 * Holds whatever is written to a Node `ServerResponse` (`writeHead`, `write`, `end`, `flushHeaders`), from its
 * construction until {@link NodeResponseHold.release}: for a framework that writes the response itself after the
 * layer's code returned (Nest writes what an interceptor's Observable emits, and what its exception filters render),
 * so that no byte leaves before the engine decided and committed. Status and headers stay on the response object
 * (`writeHead`'s are set on it); the body is collected. The same interception as `compression` and
 * `express-session`: the methods are wrapped on this one response and restored before the real write.
 */
export class NodeResponseHold {
  readonly #res: ServerResponse
  readonly #originals: Pick<ServerResponse, 'writeHead' | 'write' | 'end' | 'flushHeaders'>
  #chunks: Buffer[] = []
  #written: WrittenResponse | undefined
  #callback: (() => void) | undefined
  #waiting: ((response: WrittenResponse) => void)[] = []
  #released = false

  constructor(res: ServerResponse) {
    this.#res = res
    const { writeHead, write, end, flushHeaders } = res
    this.#originals = { writeHead, write, end, flushHeaders }
    const hold = this
    res.writeHead = function (this: ServerResponse, status: number, ...rest: unknown[]) {
      return keepWriteHead(this, status, rest)
    } as ServerResponse['writeHead']
    res.flushHeaders = () => {}
    res.write = function (this: ServerResponse, chunk: Chunk, ...rest: unknown[]) {
      if (hold.#written === undefined) hold.#chunks.push(toBuffer(chunk, rest[0]))
      const callback = rest.find((arg) => typeof arg === 'function') as (() => void) | undefined
      if (callback) process.nextTick(callback)
      return true
    } as ServerResponse['write']
    res.end = function (this: ServerResponse, ...args: unknown[]) {
      // A second response for the same request (a write after the first one ended) is dropped.
      if (hold.#written !== undefined) return this
      if (args[0] !== undefined && args[0] !== null && typeof args[0] !== 'function') {
        hold.#chunks.push(toBuffer(args[0] as Chunk, args[1]))
      }
      // `end(callback)`, `end(chunk, callback)`, `end(chunk, encoding, callback)`: the callback runs on the real end.
      hold.#callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined
      const written = {
        status: this.statusCode,
        headers: headerStrings(this.getHeaders()),
        body: Buffer.concat(hold.#chunks),
      }
      hold.#written = written
      hold.#chunks = []
      for (const resolve of hold.#waiting.splice(0)) resolve(written)
      return this
    } as ServerResponse['end']
  }

  /** The response written so far in full (its `end()` was called), if any. */
  get held(): WrittenResponse | undefined {
    return this.#written
  }

  /** Resolves with the response once it was written in full (at once when it already was). */
  written(): Promise<WrittenResponse> {
    const written = this.#written
    if (written) return Promise.resolve(written)
    return new Promise((resolve) => this.#waiting.push(resolve))
  }

  /**
   * Stops holding. Without `send`, the held response goes out as it was written (or, when none was, the response
   * is left to whoever writes it next); with `send`, that function writes the response in its place, through the
   * restored methods, and the held body is dropped.
   */
  release(send?: (res: ServerResponse) => void): void {
    if (this.#released) return
    this.#released = true
    const res = this.#res
    Object.assign(res, this.#originals)
    if (send) {
      send(res)
      return
    }
    const written = this.#written
    if (written) {
      ;(this.#originals.end as (chunk: Buffer, callback?: () => void) => ServerResponse).call(
        res,
        written.body,
        this.#callback,
      )
    }
  }
}
