import type { OutgoingHttpHeaders, ServerResponse } from 'node:http'

/** A response as it was written to a Node response object and held back from the wire. */
export interface WrittenResponse {
  status: number
  /** As the response has them (`getHeaders()`): lower-case names, a value a string, a number or strings. */
  headers: OutgoingHttpHeaders
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

/** How a {@link NodeResponseHold} holds: while `holding()` says so, and telling `ended` of the response once ended. */
export interface NodeHoldOptions {
  /**
   * Whether a write is held now; while it returns false, every method writes through to the wire.
   * @default always, until released
   */
  holding?: () => boolean
  /** Called, synchronously, with the response as soon as it was written in full (its `end()` was called). */
  ended?: (response: WrittenResponse) => void
}

const always = () => true

/**
 * Holds whatever is written to a Node `ServerResponse` (`writeHead`, `write`, `end`, `flushHeaders`), from its
 * construction until {@link NodeResponseHold.release}: for a framework that writes the response itself after the
 * layer's code returned (Nest writes what an interceptor's Observable emits, and what its exception filters render),
 * or whose handlers write to it (Express), so that no byte leaves before the engine decided and committed. Status
 * and headers stay on the response object (`writeHead`'s are set on it); the body is collected. The same
 * interception as `compression` and `express-session`: the methods are wrapped on this one response and restored
 * before the real write.
 */
export class NodeResponseHold {
  readonly #res: ServerResponse
  readonly #originals: Pick<ServerResponse, 'writeHead' | 'write' | 'end' | 'flushHeaders'>
  readonly #holding: () => boolean
  readonly #ended: ((response: WrittenResponse) => void) | undefined
  #chunks: Buffer[] = []
  #written: WrittenResponse | undefined
  #callback: (() => void) | undefined
  #waiting: ((response: WrittenResponse) => void)[] = []
  #released = false

  constructor(res: ServerResponse, options: NodeHoldOptions = {}) {
    this.#res = res
    this.#holding = options.holding ?? always
    this.#ended = options.ended
    const { writeHead, write, end, flushHeaders } = res
    this.#originals = { writeHead, write, end, flushHeaders }
    const hold = this
    res.writeHead = function (this: ServerResponse, status: number, ...rest: unknown[]) {
      if (!hold.#holding())
        return (writeHead as (...args: unknown[]) => ServerResponse).call(this, status, ...rest)
      return keepWriteHead(this, status, rest)
    } as ServerResponse['writeHead']
    res.flushHeaders = function (this: ServerResponse) {
      if (!hold.#holding()) flushHeaders.call(this)
    }
    res.write = function (this: ServerResponse, chunk: Chunk, ...rest: unknown[]) {
      if (!hold.#holding()) return (write as (...args: unknown[]) => boolean).call(this, chunk, ...rest)
      if (hold.#written === undefined) hold.#chunks.push(toBuffer(chunk, rest[0]))
      const callback = rest.find((arg) => typeof arg === 'function') as (() => void) | undefined
      if (callback) process.nextTick(callback)
      return true
    } as ServerResponse['write']
    res.end = function (this: ServerResponse, ...args: unknown[]) {
      if (!hold.#holding()) return (end as (...args: unknown[]) => ServerResponse).apply(this, args)
      // A second response for the same request (a write after the first one ended) is dropped.
      if (hold.#written !== undefined) return this
      hold.#end(args)
      return this
    } as ServerResponse['end']
  }

  #end(args: unknown[]): void {
    if (args[0] !== undefined && args[0] !== null && typeof args[0] !== 'function') {
      this.#chunks.push(toBuffer(args[0] as Chunk, args[1]))
    }
    // `end(callback)`, `end(chunk, callback)`, `end(chunk, encoding, callback)`: the callback runs on the real end.
    this.#callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined
    // The headers as set (lower-case names): the engine serialises the ones it stores, once.
    const written = {
      status: this.#res.statusCode,
      headers: this.#res.getHeaders(),
      body: Buffer.concat(this.#chunks),
    }
    this.#written = written
    this.#chunks = []
    this.#ended?.(written)
    for (const resolve of this.#waiting.splice(0)) resolve(written)
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
    if (written) this.#endWith(written.body)
  }

  /** Stops holding and ends the response with `body` in place of the held one (the end's callback still runs). */
  releaseWith(body: Buffer): void {
    if (this.#released) return
    this.#released = true
    Object.assign(this.#res, this.#originals)
    this.#endWith(body)
  }

  #endWith(body: Buffer): void {
    ;(this.#originals.end as (chunk: Buffer, callback?: () => void) => ServerResponse).call(
      this.#res,
      body,
      this.#callback,
    )
  }
}
