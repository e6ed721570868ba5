import type { IncomingMessage, ServerResponse } from 'node:http'
import {
  type CallHandler,
  Inject,
  Injectable,
  type ExecutionContext as NestExecutionContext,
  type NestInterceptor,
} from '@nestjs/common'
import { RESPONSE_PASSTHROUGH_METADATA, ROUTE_ARGS_METADATA } from '@nestjs/common/constants.js'
import { RouteParamtypes } from '@nestjs/common/enums/route-paramtypes.enum.js'
import { lastValueFrom, Observable, type Subscriber } from 'rxjs'
import { defaultRenderError } from '../engine/classify.js'
import type { ExecutionContext, HandlerResponse } from '../engine/types.js'
import {
  nodeResponseWriter,
  problemAnswer,
  type ReplacingAnswer,
  type ResponseWriter,
  replyWriter,
} from '../http/answer.js'
import { createHttpCore, type HttpCore, PASS } from '../http/core.js'
import { HeldResponse } from '../http/held.js'
import { readNodeBody, sendRefusal } from '../http/node.js'
import { NodeResponseHold, type WrittenResponse } from '../http/node-hold.js'
import type { AdapterLogger, ResolvedRoute } from '../http/options.js'
import { createRequestPolicy, type RequestPolicy } from '../http/policy.js'
import {
  announcesBody,
  DEFAULT_MAX_BODY_BYTES,
  decodePath,
  headerProblem,
  isSafeMethod,
  parseBody,
  payloadTooLarge,
  targetPath,
} from '../http/request.js'
import { ADAPTER, nestLogger, ONCELY_OPTIONS, type OncelyModuleOptions } from './options.js'

/** The metadata key under which `@Idempotent()` keeps the route's resolved options on the handler. */
export const IDEMPOTENT_ROUTE = 'oncely:idempotent'

/** Marks a request the layer already serves, so that the interceptor bound twice (globally too) acts once. */
const kServed = Symbol('oncely.served')

/** Where the execution context of a request lives: `request.idempotency`, as with the Express and Fastify adapters. */
export type WithIdempotency = { idempotency?: ExecutionContext<unknown> | null }

// The request and response as the two platforms hand them out: Express's are Node's own objects, Fastify's wrap them.
type PlatformRequest = WithIdempotency & {
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

const NO_BYTES = Buffer.alloc(0)

const refused = (answer: ReplacingAnswer) => ({ ok: false, answer }) as const

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

/** The handlers' shared state per module options: one core (one outage log, one log per mistake). */
const cores = new WeakMap<OncelyModuleOptions, HttpCore>()

/**
 * The interceptor `@Idempotent()` applies: it reads and checks the key, parses the body strictly, runs the route
 * through the engine with the handler inside the transaction that also completes the key record, and holds what Nest
 * writes (the handler's result, or the page an exception filter rendered) until that commit. It acts only on the
 * handlers `@Idempotent()` marked, and once per request, so it may also be bound globally
 * (`app.useGlobalInterceptors(app.get(IdempotencyInterceptor))`).
 */
export class IdempotencyInterceptor implements NestInterceptor {
  readonly #options: OncelyModuleOptions
  readonly #core: HttpCore
  readonly #log: AdapterLogger
  readonly #policy: RequestPolicy

  constructor(options: OncelyModuleOptions) {
    this.#options = options
    let core = cores.get(options)
    if (!core) {
      core = createHttpCore(options.engine, ADAPTER)
      cores.set(options, core)
    }
    this.#core = core
    this.#log = options.logger ?? nestLogger()
    this.#policy = createRequestPolicy(ADAPTER)
  }

  intercept(context: NestExecutionContext, next: CallHandler): Observable<unknown> {
    const route = Reflect.getMetadata(IDEMPOTENT_ROUTE, context.getHandler()) as ResolvedRoute | undefined
    if (context.getType() !== 'http' || route === undefined) return next.handle()
    const http = context.switchToHttp()
    const request = http.getRequest<PlatformRequest>()
    if (request[kServed]) return next.handle()
    request[kServed] = true
    request.idempotency = null
    return new Observable((subscriber) => {
      void this.#serve(route, context, next, request, http.getResponse(), subscriber)
    })
  }

  async #serve(
    route: ResolvedRoute,
    context: NestExecutionContext,
    next: CallHandler,
    request: PlatformRequest,
    response: unknown,
    subscriber: Subscriber<unknown>,
  ): Promise<void> {
    const raw = request.raw ?? (request as unknown as IncomingMessage)
    const fastify = isFastifyReply(response)
    const res = fastify ? response.raw : (response as ServerResponse)
    // What was set before the handler (by guards, middleware, @Header()) stays on an answer that replaces its
    // response; what the handler set does not.
    const held = fastify
      ? new HeldResponse<unknown>(fastifyWriter as ResponseWriter<unknown>, response)
      : new HeldResponse<unknown>(nodeWriter as ResponseWriter<unknown>, res)
    // Nothing Nest writes for this request leaves before the engine decided.
    const hold = new NodeResponseHold(res)
    const { emit, fail } = settleOnce(subscriber)
    // Written to Node's response once released, whichever platform: Nest writes nothing more for it.
    const replace = (answer: ReplacingAnswer) => (target: ServerResponse) =>
      target.end(held.replaceOn(nodeWriter, target, answer))
    /**
     * Answers with `answer` instead of the handler: Nest is handed nothing to send, and what it writes for that is
     * replaced. A request whose body is still unread is refused so that the answer reaches a client still sending.
     */
    const answer = async (value: ReplacingAnswer): Promise<void> => {
      const send = raw.readableEnded
        ? replace(value)
        : (target: ServerResponse) => sendRefusal(raw, target, value)
      if (writesItself(context)) {
        emit(undefined)
        return hold.release(send)
      }
      const written = hold.written()
      emit(undefined)
      await written
      hold.release(send)
    }
    const method = String(raw.method).toUpperCase()
    const header = (name: string) => raw.headers[name]
    let ran = false
    let thrown: { error: unknown; page: WrittenResponse } | undefined
    try {
      const admitted = await this.#admit(route, request, raw, fastify)
      if (!admitted.ok) return await answer(admitted.answer)
      const { body, template } = admitted
      // The page Nest's exception filters rendered for an error the handler threw: stored when it is permanent.
      const perRequest: ResolvedRoute = {
        ...route,
        renderError:
          route.renderError ??
          ((error) => {
            const filtered = thrown as { error: unknown; page: WrittenResponse } | undefined
            return filtered && filtered.error === error ? pageOf(filtered.page) : defaultRenderError(error)
          }),
      }
      const verdict = await this.#core.handle(perRequest, {
        method,
        route: template ?? (route.operation as string),
        path: decodePath(targetPath(request.originalUrl ?? raw.url ?? '/')),
        header,
        body,
        query: () => request.query as Record<string, unknown>,
        tenant: () => this.#options.tenant(request, context),
        log: this.#log,
        run: (ctx) =>
          held.runReturning(async () => {
            ran = true
            request.idempotency = ctx
            const written = hold.written()
            const done = lastValueFrom(next.handle(), { defaultValue: undefined }).then(
              (value) => ({ value }),
              (error: unknown) => ({ error }),
            )
            const first = await Promise.race([done, written])
            if ('status' in first) {
              // The handler wrote the response itself (`@Res()`) before it returned.
              void done.then((result) => ('value' in result ? emit(result.value) : fail(result.error)))
              return first
            }
            if ('error' in first) {
              // Its writes roll back: the page that answers the error carries none of the headers it set.
              held.undo()
              const page = hold.written()
              fail(first.error)
              thrown = { error: first.error, page: await page }
              throw first.error
            }
            emit(first.value)
            return await written
          }),
      })
      if (verdict === PASS) {
        request.idempotency = null
        hold.release()
        next.handle().subscribe(subscriber)
        return
      }
      if (verdict.own) return hold.release()
      if (!ran) return await answer(verdict)
      hold.release(replace(verdict))
    } catch (error) {
      if (thrown && error === thrown.error) {
        // A retryable error: the page Nest's filters rendered goes out as it is.
        hold.release()
      } else if (hold.held) {
        // The engine failed after Nest had written the response, which never reached the client.
        this.#log.error(
          { err: error },
          `oncely: ${method} ${raw.url} failed before its commit: ${messageOf(error)}`,
        )
        hold.release(replace(failedAnswer()))
      } else {
        // Before the handler ran (the tenant function threw): Nest's exception filters answer.
        hold.release()
        fail(error)
      }
    }
  }

  /**
   * What the policy of every adapter admits of a request before the engine sees it: its strictly parsed body and
   * the route template, or the answer that refuses it.
   */
  async #admit(
    route: ResolvedRoute,
    request: PlatformRequest,
    raw: IncomingMessage,
    fastify: boolean,
  ): Promise<
    { ok: true; body: unknown; template: string | undefined } | { ok: false; answer: ReplacingAnswer }
  > {
    const method = String(raw.method).toUpperCase()
    const header = (name: string) => raw.headers[name]
    // The one policy of every adapter: an idempotent handler never runs unguarded on a safe method.
    if (isSafeMethod(method)) {
      return refused(this.#policy.safeMethod(method, `${method} ${raw.url ?? '/'}`, this.#log))
    }
    const limit = route.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES
    const early = headerProblem(header, limit)
    if (early) return refused(problemAnswer(early))
    let bytes: Buffer = NO_BYTES
    if (!raw.readableEnded) {
      const read = await readNodeBody(raw, limit)
      if (!read.ok) return refused(problemAnswer(read.problem))
      bytes = read.bytes
    } else if (Buffer.isBuffer(request.rawBody)) {
      bytes = request.rawBody
    } else if (announcesBody(header)) {
      return refused(
        this.#policy.bodyConsumed(
          `${method} ${raw.url}`,
          "Nest's body parser kept no bytes of it: create the app with `NestFactory.create(AppModule, adapter, { rawBody: true })`, which keeps them (or with `bodyParser: false` on Express).",
          this.#log,
        ),
      )
    }
    if (bytes.length > limit) return refused(problemAnswer(payloadTooLarge()))
    const parsed = parseBody(bytes, header)
    if (!parsed.ok) return refused(problemAnswer(parsed.problem))
    const { body } = parsed
    request.body = body

    const template = fastify
      ? request.routeOptions?.url
      : request.route?.path !== undefined
        ? `${request.baseUrl ?? ''}${String(request.route.path)}`
        : undefined
    if (template === undefined && route.operation === undefined) {
      return refused(
        this.#policy.misplaced(
          `${method} ${raw.url}`,
          `@Idempotent() ran on ${method} ${raw.url} without a route template to name the operation; give it \`operation\`.`,
          this.#log,
        ),
      )
    }
    return { ok: true, body, template }
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

// Nest reads a class's dependencies from `design:paramtypes`, which only a compiler emitting decorator metadata
// writes; an explicit token needs neither that nor decorators in this file.
Inject(ONCELY_OPTIONS)(IdempotencyInterceptor, undefined, 0)
Injectable()(IdempotencyInterceptor)
