import type { HandlerResponse } from '../engine/types.js'
import {
  type Answer,
  type HeaderSnapshot,
  type ReplacingAnswer,
  type ResponseWriter,
  resetHandlerHeaders,
  snapshotHeaders,
  writeReplacement,
} from './answer.js'

/** What an intercepted send does with the engine's decision on the response it handed over. */
export interface HeldSend {
  /** The answer: the handler's own response (`own`), or the replacement to write in its place. */
  release(answer: Answer): void
  /** The engine failed, or the handler's error is to be answered by the framework's error handling. */
  fail(error: unknown): void
}

/** What the core does with a request's held response: settle it with the decision. */
export interface HoldSettlement {
  settle(verdict: Answer): boolean
  /** The core's failure: true when it went to the held send, false when the adapter is to propagate it. */
  settleError(error: unknown): boolean
}

/**
 * Where a held response is. `idle` until the handler runs; `running` while it runs and has sent nothing; `sending`
 * once a framework's send began (Fastify's `reply.send`) but its response is not handed over yet; `captured` once
 * it was, waiting for the decision; `settled` once the core decided.
 */
type HoldState = 'idle' | 'running' | 'sending' | 'captured' | 'settled'

/**
 * The response of one request between the handler and the wire, owned by the HTTP core: the adapter only tells it
 * what happened (the handler runs, it began to send, here is what it sent) and asks it to write an answer; the
 * core settles it. Only once the key record and the business writes are committed does a byte of the handler's
 * response leave, so a crash after the commit replays the same response and a failed commit never reaches the
 * client as a 2xx. An answer that replaces the handler's response (a replay, a problem, the error page after it
 * threw) carries none of the headers the handler set.
 *
 * For frameworks whose handlers write to a response object (Fastify's reply, Express's res), pass it as
 * `Exchange.held` and run the handler with {@link HeldResponse.run}; for those whose handlers answer by returning
 * (Koa's ctx once the middleware returned), with {@link HeldResponse.runReturning}.
 */
export class HeldResponse<R> implements HoldSettlement {
  readonly #writer: ResponseWriter<R>
  readonly #response: R
  #state: HoldState = 'idle'
  /** True once the handler sent (or began to send) its response. */
  #sent = false
  /**
   * The response's headers when the handler started (`undefined` until it runs): what an answer that replaces the
   * handler's response gives back.
   */
  #before: HeaderSnapshot | undefined
  /** Resolves what {@link HeldResponse.run} returned, with the response the handler sent. */
  #captured: ((response: HandlerResponse | PromiseLike<HandlerResponse>) => void) | undefined
  #send: HeldSend | undefined

  constructor(writer: ResponseWriter<R>, response: R) {
    this.#writer = writer
    this.#response = response
  }

  /** True while the handler runs and its response was not handed over yet: its sends are to be intercepted. */
  get capturing(): boolean {
    return this.#state === 'running' || this.#state === 'sending'
  }

  /**
   * Runs a handler that sends through the response object and resolves with its response once it was handed over
   * ({@link HeldResponse.capture}). A handler may resolve before it sends (a callback answers later) or only after
   * its response is written, which waits for the commit, so its promise is not awaited: its rejection before it
   * sent rejects, and `returned` sees the value it resolved with when it had not sent by then.
   */
  run(invoke: () => unknown, returned?: (value: unknown) => void): Promise<HandlerResponse> {
    this.#begin()
    return new Promise<HandlerResponse>((resolve, reject) => {
      this.#captured = resolve
      Promise.resolve(invoke()).then((value) => {
        if (!this.#sent) returned?.(value)
      }, reject)
    })
  }

  /** Runs a handler whose response is what it returns (read once it returned). */
  runReturning(invoke: () => Promise<HandlerResponse>): Promise<HandlerResponse> {
    this.#begin()
    return invoke()
  }

  #begin(): void {
    this.#before = snapshotHeaders(this.#writer, this.#response)
    this.#state = 'running'
  }

  /** The framework's send began; its response is handed over later (Fastify's onSend). */
  sending(): void {
    this.#sent = true
    if (this.#state === 'running') this.#state = 'sending'
  }

  /**
   * Hands over the response the handler sent, with what to do once the engine decided. False when the hold is not
   * capturing (the handler had not started, or the core already settled): let the send go out as it is.
   */
  capture(response: HandlerResponse | PromiseLike<HandlerResponse>, send: HeldSend): boolean {
    if (!this.capturing) return false
    this.#state = 'captured'
    this.#sent = true
    this.#send = send
    this.#captured?.(response)
    return true
  }

  settle(verdict: Answer): boolean {
    const send = this.#settle()
    send?.release(verdict)
    return this.#sent
  }

  settleError(error: unknown): boolean {
    const send = this.#settle()
    send?.fail(error)
    return this.#sent
  }

  /** Ends capturing; the send waiting for the decision, if one was handed over. */
  #settle(): HeldSend | undefined {
    const waiting = this.#state === 'captured' ? this.#send : undefined
    this.#state = 'settled'
    this.#send = undefined
    return waiting
  }

  /** Writes a replacement's status and headers in place of what the handler set; returns the body to send. */
  replace(answer: ReplacingAnswer): Buffer {
    return writeReplacement(this.#writer, this.#response, answer, this.#before)
  }

  /**
   * {@link HeldResponse.replace} onto another view of the same response: Node's own, where a framework's reply
   * wraps it and the replacement is written to Node's once released (NestJS on Fastify).
   */
  replaceOn<T>(writer: ResponseWriter<T>, response: T, answer: ReplacingAnswer): Buffer {
    return writeReplacement(writer, response, answer, this.#before)
  }

  /**
   * Takes back the headers the handler set, for an error page that replaces its response (its writes rolled back);
   * nothing when it never ran.
   */
  undo(): void {
    if (this.#before) resetHandlerHeaders(this.#writer, this.#response, this.#before)
  }
}
