import type { IncomingMessage, ServerResponse } from 'node:http'
import type { CallHandler, ExecutionContext as NestExecutionContext } from '@nestjs/common'
import { RESPONSE_PASSTHROUGH_METADATA, ROUTE_ARGS_METADATA } from '@nestjs/common/constants.js'
import { RouteParamtypes } from '@nestjs/common/enums/route-paramtypes.enum.js'
import { lastValueFrom, type Subscriber } from 'rxjs'
import { defaultRenderError } from '../engine/classify.js'
import type { ExecutionContext, HandlerResponse } from '../engine/types.js'
import {
  nodeResponseWriter,
  problemAnswer,
  type ReplacingAnswer,
  type ResponseWriter,
  replyWriter,
} from '../http/answer.js'
import { PASS, type Verdict } from '../http/core.js'
import { HeldResponse } from '../http/held.js'
import { sendRefusal } from '../http/node.js'
import { NodeResponseHold, type WrittenResponse } from '../http/node-hold.js'
import type { AdapterLogger, ResolvedRoute } from '../http/options.js'

/** Marks a request the layer already serves, so that the interceptor bound twice (globally too) acts once. */
export const kServed = Symbol('oncely.served')

// The request and response as the two platforms hand them out: Express's are Node's own objects, Fastify's wrap them.
export type PlatformRequest = {
  idempotency?: ExecutionContext<unknown> | null
  [kServed]?: true
  raw?: IncomingMessage
  body?: unknown
  rawBody?: unknown
  query?: unknown
  originalUrl?: string
  baseUrl?: string
  route?: { path?: unknown }
  routeOptions?: { url?: string }
}
type FastifyReplyLike = {
  raw: ServerResponse
  code(status: number): unknown
  header(name: string, value: unknown): unknown
  removeHeader(name: string): unknown
  getHeaders(): Record<string, string | number | string[] | undefined>
}

const nodeWriter = nodeResponseWriter
const fastifyWriter = replyWriter as ResponseWriter<FastifyReplyLike>

const isFastifyReply = (response: unknown): response is FastifyReplyLike =>
  typeof (response as { raw?: unknown }).raw === 'object' &&
  typeof (response as { getHeaders?: unknown }).getHeaders === 'function'

/** The answer when the engine failed after the response was written (it never reached the client). */
const failedAnswer = (): ReplacingAnswer =>
  problemAnswer({
    type: 'about:blank',
    title: 'Internal Server Error',
    status: 500,
    detail: 'The request failed before it was committed; retry it with the same key.',
  })

const sendsItself = new WeakMap<object, boolean>()

/**
 * True for a handler that writes the response itself (`@Res()` or `@Next()` without `passthrough`), as Nest decides
 * it: Nest sends nothing for it, so an answer that replaces it is written by the layer.
 */
function writesItself(context: NestExecutionContext): boolean {
  const handler = context.getHandler()
  let known = sendsItself.get(handler)
  if (known === undefined) {
    known = false
    // Parameter decorators store their metadata on the class that declares the method.
    for (
      let host: unknown = context.getClass();
      typeof host === 'function';
      host = Object.getPrototypeOf(host)
    ) {
      const args = Reflect.getMetadata(ROUTE_ARGS_METADATA, host, handler.name) as object | undefined
      if (args === undefined) continue
      const handled = Object.keys(args).some((key) => {
        const type = Number(key.split(':')[0])
        return type === RouteParamtypes.RESPONSE || type === RouteParamtypes.NEXT
      })
      known = handled && !Reflect.getMetadata(RESPONSE_PASSTHROUGH_METADATA, host, handler.name)
      break
    }
    sendsItself.set(handler, known)
  }
  return known
}

/**
 * One request the interceptor serves: what Nest writes for it is held until the engine decided, the handler is run
 * through Nest inside the engine's transaction, and what Nest is handed (a value, an error, or nothing when the
 * layer answers) is settled once.
 */
export class ServedRequest {
  readonly raw: IncomingMessage
  readonly fastify: boolean
  readonly method: string
  readonly #context: NestExecutionContext
  readonly #next: CallHandler
  readonly #request: PlatformRequest
  readonly #subscriber: Subscriber<unknown>
  readonly #held: HeldResponse<unknown>
  readonly #hold: NodeResponseHold
  readonly #emit: (value: unknown) => void
  readonly #fail: (error: unknown) => void
  /** True once the engine ran the handler. */
  #ran = false
  /** The error the handler threw and the page Nest's exception filters rendered for it. */
  #thrown: { error: unknown; page: WrittenResponse } | undefined

  constructor(
    context: NestExecutionContext,
    next: CallHandler,
    request: PlatformRequest,
    response: unknown,
    subscriber: Subscriber<unknown>,
  ) {
    this.#context = context
    this.#next = next
    this.#request = request
    this.#subscriber = subscriber
    this.raw = request.raw ?? (request as unknown as IncomingMessage)
    this.fastify = isFastifyReply(response)
    const res = this.fastify ? (response as FastifyReplyLike).raw : (response as ServerResponse)
    // What was set before the handler (by guards, middleware, @Header()) stays on an answer that replaces its
    // response; what the handler set does not.
    this.#held = this.fastify
      ? new HeldResponse<unknown>(fastifyWriter as ResponseWriter<unknown>, response)
      : new HeldResponse<unknown>(nodeWriter as ResponseWriter<unknown>, res)
    // Nothing Nest writes for this request leaves before the engine decided.
    this.#hold = new NodeResponseHold(res)
    const { emit, fail } = settleOnce(subscriber)
    this.#emit = emit
    this.#fail = fail
    this.method = String(this.raw.method).toUpperCase()
  }

  /** The route as this request runs it, with its own `renderError` or else the one below. */
  route(route: ResolvedRoute): ResolvedRoute {
    // The page Nest's exception filters rendered for an error the handler threw: stored when it is permanent.
    return {
      ...route,
      renderError:
        route.renderError ??
        ((error) => {
          const filtered = this.#thrown
          return filtered && filtered.error === error ? pageOf(filtered.page) : defaultRenderError(error)
        }),
    }
  }

  /** Runs the handler through Nest (the engine's `run`) and resolves with the response Nest wrote for it. */
  run(ctx: ExecutionContext<unknown>): Promise<HandlerResponse> {
    return this.#held.runReturning(() => this.#handle(ctx))
  }

  /**
   * Hands the request on to Nest's handler and waits for whichever comes first: the value it returned (which Nest is
   * handed to write), the error it threw (for Nest's exception filters to render), or the response it wrote itself.
   */
  async #handle(ctx: ExecutionContext<unknown>): Promise<WrittenResponse> {
    this.#ran = true
    this.#request.idempotency = ctx
    const hold = this.#hold
    const written = hold.written()
    const done = lastValueFrom(this.#next.handle(), { defaultValue: undefined }).then(
      (value) => ({ value }),
      (error: unknown) => ({ error }),
    )
    const first = await Promise.race([done, written])
    if ('status' in first) {
      // The handler wrote the response itself (`@Res()`) before it returned.
      void done.then((result) => ('value' in result ? this.#emit(result.value) : this.#fail(result.error)))
      return first
    }
    if ('error' in first) {
      // Its writes roll back: the page that answers the error carries none of the headers it set.
      this.#held.undo()
      const page = hold.written()
      this.#fail(first.error)
      this.#thrown = { error: first.error, page: await page }
      throw first.error
    }
    this.#emit(first.value)
    return await written
  }

  /**
   * Answers with `answer` instead of the handler: Nest is handed nothing to send, and what it writes for that is
   * replaced. A request whose body is still unread is refused so that the answer reaches a client still sending.
   */
  async answer(value: ReplacingAnswer): Promise<void> {
    const raw = this.raw
    const send = raw.readableEnded
      ? this.#replace(value)
      : (target: ServerResponse) => sendRefusal(raw, target, value)
    if (writesItself(this.#context)) {
      this.#emit(undefined)
      return this.#hold.release(send)
    }
    const written = this.#hold.written()
    this.#emit(undefined)
    await written
    this.#hold.release(send)
  }

  /** Sends what the engine decided: the route without the layer, the handler's own response, or the answer. */
  async conclude(verdict: Verdict): Promise<void> {
    if (verdict === PASS) {
      this.#request.idempotency = null
      this.#hold.release()
      this.#next.handle().subscribe(this.#subscriber)
      return
    }
    if (verdict.own) return this.#hold.release()
    if (!this.#ran) return await this.answer(verdict)
    this.#hold.release(this.#replace(verdict))
  }

  /** Answers an error the engine (or the handler inside it) threw. */
  failed(error: unknown, log: AdapterLogger): void {
    const hold = this.#hold
    if (this.#thrown && error === this.#thrown.error) {
      // A retryable error: the page Nest's filters rendered goes out as it is.
      hold.release()
    } else if (hold.held) {
      // The engine failed after Nest had written the response, which never reached the client.
      log.error(
        { err: error },
        `oncely: ${this.method} ${this.raw.url} failed before its commit: ${messageOf(error)}`,
      )
      hold.release(this.#replace(failedAnswer()))
    } else {
      // Before the handler ran (the tenant function threw): Nest's exception filters answer.
      hold.release()
      this.#fail(error)
    }
  }

  // Written to Node's response once released, whichever platform: Nest writes nothing more for it.
  #replace(answer: ReplacingAnswer): (target: ServerResponse) => void {
    return (target) => target.end(this.#held.replaceOn(nodeWriter, target, answer))
  }
}

/** What Nest is handed for the request: a value to send, or an error for its filters; the first one only. */
function settleOnce(subscriber: Subscriber<unknown>): {
  emit: (value: unknown) => void
  fail: (error: unknown) => void
} {
  let settled = false
  return {
    emit(value) {
      if (settled) return
      settled = true
      subscriber.next(value)
      subscriber.complete()
    },
    fail(error) {
      if (settled) return
      settled = true
      subscriber.error(error)
    },
  }
}

function pageOf(page: WrittenResponse): HandlerResponse {
  return { status: page.status, headers: page.headers, body: page.body }
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}
