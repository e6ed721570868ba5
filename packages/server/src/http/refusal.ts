import type { ReplacingAnswer } from './answer.js'

/**
 * Answering a request before its body was read (413 over the limit, 415 not JSON) so that the answer reaches a
 * client that is still sending the body.
 *
 * Closing the connection while the client's bytes are still arriving makes the server's kernel reset it (RST), and
 * the reset discards the answer at the client before it read it: the client sees EPIPE or ECONNRESET and retries a
 * permanent refusal as if the network had failed. Keeping the connection for further requests instead obliges the
 * server to read the rest of the body, however large. So the answer says `Connection: close` and goes out complete
 * at once, but the response, and with it the connection, ends only once the rest of the body was read and thrown
 * away, or the {@link DrainLimits} were reached: the lingering close of nginx and Apache.
 */

/** How much of a refused body is read and thrown away after the answer, and for how long, before closing anyway. */
export interface DrainLimits {
  /** Bytes read past the answer. */
  bytes: number
  /** Milliseconds from the answer, whatever the client still sends. */
  ms: number
}

/**
 * 16 MiB and 5 s: a client on a modest link finishes sending a body of a few megabytes in that time and gets the
 * answer, while a client that never stops (or stalls) holds a connection for 5 s at most and costs no memory.
 */
export const DRAIN_LIMITS: DrainLimits = { bytes: 16 * 1024 * 1024, ms: 5_000 }

/** The next chunk of a request body: `reader.read()` of a web stream, `next()` of a Node stream's iterator. */
export type ChunkSource = () => Promise<{ done?: boolean; value?: Uint8Array }>

/**
 * Reads and throws away the rest of a body. Resolves true once it ended (or the client went away), false when the
 * limits cut it short; it never rejects.
 */
export function discardBody(
  next: ChunkSource | undefined,
  limits: DrainLimits = DRAIN_LIMITS,
): Promise<boolean> {
  if (next === undefined) return Promise.resolve(true)
  return new Promise((resolve) => {
    let settled = false
    const settle = (ended: boolean) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      resolve(ended)
    }
    const timer = setTimeout(() => settle(false), limits.ms)
    let bytes = 0
    const pump = async () => {
      while (!settled) {
        const { done, value } = await next()
        if (done) return settle(true)
        bytes += value?.byteLength ?? 0
        if (bytes > limits.bytes) return settle(false)
      }
    }
    // A body that fails (the client reset or went away) has nothing more to wait for.
    pump().catch(() => settle(true))
  })
}

/** A refusal as the framework sends it: the answer's status, its headers and a body stream. */
export interface Refusal {
  status: number
  /** The answer's headers with `connection: close` and its `content-length`. */
  headers: Record<string, string>
  /** The answer's bytes at once; the stream ends once the rest of the request body was discarded (or cut short). */
  body: ReadableStream<Uint8Array>
}

/**
 * Refuses a request whose body is not (fully) read, with `answer`, discarding the rest of the body from `rest`
 * (`undefined` when there is none) within `limits`. The discarding starts now, not when the framework starts
 * sending, so the client's writes never stall.
 */
export function refuse(
  answer: ReplacingAnswer,
  rest: ChunkSource | undefined,
  limits: DrainLimits = DRAIN_LIMITS,
): Refusal {
  const discarded = discardBody(rest, limits)
  const bytes = new Uint8Array(answer.body)
  return {
    status: answer.status,
    headers: { ...answer.headers, connection: 'close', 'content-length': String(bytes.byteLength) },
    body: new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(bytes)
      },
      // Called once the answer's bytes were taken: the response ends when the body was discarded.
      async pull(controller) {
        await discarded
        controller.close()
      },
    }),
  }
}
