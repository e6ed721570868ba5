import type { ServerResponse } from 'node:http'
import type { NextFunction, Request, RequestHandler, Response } from 'express'
import type pg from 'pg'
import type { ExecutionContext } from '../engine/types.js'
import { standaloneAdapter } from '../http/adapter.js'
import { type Answer, nodeResponseWriter } from '../http/answer.js'
import { PASS, type Verdict } from '../http/core.js'
import { HeldResponse } from '../http/held.js'
import { nodeAdmission, sendRefusal } from '../http/node.js'
import { NodeResponseHold } from '../http/node-hold.js'
import {
  type IdempotencyRouteOptions,
  routeArguments,
  type StandaloneAdapterOptions,
} from '../http/options.js'

const ADAPTER = '@oncely/server/express'

/**
 * Options of {@link idempotency}: `engine`, `tenant(req)` and `logger`. `Tx` is the transaction type of the engine's
 * datasource, inferred from `engine`.
 */
export type ExpressIdempotencyOptions<Tx = pg.PoolClient> = StandaloneAdapterOptions<Request, [], Tx>

/**
 * An Express request on an idempotent route: `req.idempotency` is the execution context (`tx`, `key`, ...). Name
 * your datasource's transaction in it for a handler written apart from its route:
 * `ExpressIdempotentRequest<ExecutionContext<Transaction<DB>>>`.
 */
export type ExpressIdempotentRequest<Context extends ExecutionContext<unknown> | null = ExecutionContext> =
  Request & {
    /** The execution context: `tx` (the business transaction), `key`, `stepKey()`, ... */
    idempotency: Context
  }

/** A route handler made idempotent by {@link idempotency}: an Express handler whose `req` has `idempotency`. */
export type ExpressIdempotentHandler<Context extends ExecutionContext<unknown> | null = ExecutionContext> = (
  req: ExpressIdempotentRequest<Context>,
  res: Response,
  next: NextFunction,
) => unknown

/**
 * Makes one route handler idempotent; see {@link idempotency}. Its handler's `req.idempotency.tx` is a `Tx`, the
 * transaction type of the engine's datasource.
 */
export interface ExpressIdempotent<Tx = pg.PoolClient> {
  (handler: ExpressIdempotentHandler<ExecutionContext<Tx>>): RequestHandler
  (
    options: IdempotencyRouteOptions & { required?: true },
    handler: ExpressIdempotentHandler<ExecutionContext<Tx>>,
  ): RequestHandler
  (
    options: IdempotencyRouteOptions,
    handler: ExpressIdempotentHandler<ExecutionContext<Tx> | null>,
  ): RequestHandler
}

const writer = nodeResponseWriter

/**
 * Holds what the handler writes to `res` (`res.json()`, `res.send()`, `writeHead`, `write`, `end`, a piped stream)
 * instead of sending it, until the engine decided; then sends the handler's own response or the answer that
 * replaces it. Once the response was handed over, or the core decided without one, `res` writes through.
 */
function holdResponse(
  res: ServerResponse,
  held: HeldResponse<ServerResponse>,
  fail: (error: unknown) => void,
): void {
  const hold: NodeResponseHold = new NodeResponseHold(res, {
    holding: () => held.capturing,
    ended: (written) => {
      const taken = held.capture(written, {
        release: (answer) => (answer.own ? hold.release() : hold.releaseWith(held.replace(answer))),
        fail: (error) =>
          hold.release(() => {
            held.undo()
            fail(error)
          }),
      })
      // Ended while capturing, so always taken; a hold that was not would write through.
      if (!taken) hold.release()
    },
  })
}

/**
 * The Express adapter, for Express 5 and Express 4 (from 4.21). `idempotency(options)` returns `idempotent`, which
 * wraps a route handler: the handler runs inside the transaction that also completes the key record
 * (`req.idempotency.tx`), what it writes to `res` is held until that commit, and a retry with the same
 * `Idempotency-Key` gets the stored response. It wraps the handler rather than running before it as middleware so
 * that it sees an error the handler throws (or passes to `next`) and can roll back the handler's writes; a
 * middleware would only see the error page your error handler renders.
 *
 * The JSON body is read and parsed strictly by `idempotent` itself: mount `express.json()` on other routes only. A
 * request whose body another parser already read is refused (500 problem+json; the log says how to fix it, once
 * per route), since its bytes can no longer be checked or fingerprinted.
 *
 * @example
 * const idempotent = idempotency({ engine, tenant: (req) => req.get('x-tenant') ?? '' })
 * app.post('/v1/payments', idempotent(async (req, res) => {
 *   const { rows } = await req.idempotency.tx.query('INSERT INTO payments (amount) VALUES ($1) RETURNING id', [100])
 *   res.status(201).json({ id: rows[0].id })
 * }))
 */
export function idempotency<Tx = pg.PoolClient>(
  options: ExpressIdempotencyOptions<Tx>,
): ExpressIdempotent<Tx> {
  const { tenant, log, core, policy } = standaloneAdapter(options, ADAPTER)
  const admit = nodeAdmission(policy, log, {
    consumed: `idempotent() reads and parses the JSON body itself: mount body parsers such as express.json() after the idempotent routes (\`app.use(express.json())\` below them) or only on the routes that need them (\`app.post('/other', express.json(), handler)\`).`,
    misplaced: `idempotent() ran outside a route (app.use?), so it cannot name the operation. Use it on a route, \`app.post('/v1/payments', idempotent(handler))\`, or give \`operation\`.`,
  })

  function idempotent(
    optionsOrHandler: IdempotencyRouteOptions | ExpressIdempotentHandler<ExecutionContext<Tx> | null>,
    maybeHandler?: ExpressIdempotentHandler<ExecutionContext<Tx> | null>,
  ): RequestHandler {
    const { handler, route } = routeArguments(optionsOrHandler, maybeHandler)

    async function idempotentRoute(req: Request, res: Response, next: NextFunction): Promise<void> {
      const request = req as ExpressIdempotentRequest<ExecutionContext<Tx> | null>
      request.idempotency = null
      // Express 4 and 5 name a route's path in their own syntaxes (`/:id?` and `{/:id}`); either is the template.
      const template = req.route ? `${req.baseUrl}${String(req.route.path)}` : undefined
      const where = () => `${req.method} ${template ?? req.originalUrl}`
      const held = new HeldResponse(writer, res)
      const answer = (value: Answer) => {
        if (!value.own) res.end(held.replace(value))
      }
      const admitted = await admit(route, {
        raw: req,
        method: req.method,
        target: req.originalUrl,
        template,
        where,
        received: (body) => {
          req.body = body
        },
      })
      // Refused before the body is read to its end: the answer must reach a client still sending it.
      if (!admitted.ok) {
        return 'refusal' in admitted ? sendRefusal(req, res, admitted.refusal) : answer(admitted.answer)
      }

      let verdict: Verdict | undefined
      try {
        verdict = await core.handle(route, {
          ...admitted.exchange,
          tenant: () => tenant(req),
          log,
          held,
          run: (ctx) => {
            request.idempotency = ctx
            holdResponse(res, held, next)
            return held.run(
              () =>
                new Promise((resolve, reject) => {
                  // `next()` and `next('route')` hand the request on (its response is still held); an error fails it.
                  const passOn: NextFunction = (error?: unknown) =>
                    !error || error === 'route' || error === 'router' ? next(error) : reject(error)
                  Promise.resolve(handler(request, res, passOn)).then(resolve, reject)
                }),
            )
          },
        })
      } catch (error) {
        // The handler threw a retryable error (its writes rolled back): the error page carries none of its headers.
        held.undo()
        return next(error)
      }
      if (verdict === undefined) return
      if (verdict === PASS) return void (await handler(request, res, next))
      answer(verdict)
    }
    // Express 5 passes a rejected promise to `next`, Express 4 leaves it unhandled: this does it for both.
    return (req, res, next) => {
      idempotentRoute(req, res, next).catch(next)
    }
  }
  return idempotent as ExpressIdempotent<Tx>
}

export type { AdapterLogger, FingerprintOptions, IdempotencyRouteOptions } from '../http/options.js'
