import type { IncomingMessage } from 'node:http'
import {
  type CallHandler,
  Inject,
  Injectable,
  type ExecutionContext as NestExecutionContext,
  type NestInterceptor,
} from '@nestjs/common'
import { Observable, type Subscriber } from 'rxjs'
import type { ExecutionContext } from '../engine/types.js'
import { problemAnswer, type ReplacingAnswer } from '../http/answer.js'
import { createHttpCore, type HttpCore } from '../http/core.js'
import { readNodeBody } from '../http/node.js'
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
import { kServed, type PlatformRequest, ServedRequest } from './served.js'

/** The metadata key under which `@Idempotent()` keeps the route's resolved options on the handler. */
export const IDEMPOTENT_ROUTE = 'oncely:idempotent'

/** Where the execution context of a request lives: `request.idempotency`, as with the Express and Fastify adapters. */
export type WithIdempotency = { idempotency?: ExecutionContext<unknown> | null }

const NO_BYTES = Buffer.alloc(0)

const refused = (answer: ReplacingAnswer) => ({ ok: false, answer }) as const

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
    const served = new ServedRequest(context, next, request, response, subscriber)
    const { raw, method } = served
    const header = (name: string) => raw.headers[name]
    try {
      const admitted = await this.#admit(route, request, raw, served.fastify)
      if (!admitted.ok) return await served.answer(admitted.answer)
      const { body, template } = admitted
      const verdict = await this.#core.handle(served.route(route), {
        method,
        route: template ?? (route.operation as string),
        path: decodePath(targetPath(request.originalUrl ?? raw.url ?? '/')),
        header,
        body,
        query: () => request.query as Record<string, unknown>,
        tenant: () => this.#options.tenant(request, context),
        log: this.#log,
        run: (ctx) => served.run(ctx),
      })
      await served.conclude(verdict)
    } catch (error) {
      served.failed(error, this.#log)
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

    const template = routeTemplate(request, fastify)
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

/** The route template the platform's router matched, if it names one. */
function routeTemplate(request: PlatformRequest, fastify: boolean): string | undefined {
  if (fastify) return request.routeOptions?.url
  return request.route?.path !== undefined
    ? `${request.baseUrl ?? ''}${String(request.route.path)}`
    : undefined
}

// Nest reads a class's dependencies from `design:paramtypes`, which only a compiler emitting decorator metadata
// writes; an explicit token needs neither that nor decorators in this file.
Inject(ONCELY_OPTIONS)(IdempotencyInterceptor, undefined, 0)
Injectable()(IdempotencyInterceptor)
