import {
  applyDecorators,
  createParamDecorator,
  type DynamicModule,
  Inject,
  Module,
  type ExecutionContext as NestExecutionContext,
  type OnApplicationBootstrap,
  type Provider,
  SetMetadata,
  UseInterceptors,
} from '@nestjs/common'
import type { ExecutionContext } from '../engine/types.js'
import { isStoreSetupError } from '../errors.js'
import { type IdempotencyRouteOptions, resolveRoute } from '../http/options.js'
import { objectOptions, requiredFunction } from '../options/check.js'
import { IDEMPOTENT_ROUTE, IdempotencyInterceptor, type WithIdempotency } from './interceptor.js'
import {
  checkModuleOptions,
  nestLogger,
  ONCELY_ENGINE,
  ONCELY_OPTIONS,
  type OncelyModuleAsyncOptions,
  type OncelyModuleOptions,
} from './options.js'

const shared: Provider[] = [
  {
    provide: ONCELY_ENGINE,
    useFactory: (options: OncelyModuleOptions) => options.engine,
    inject: [ONCELY_OPTIONS],
  },
  {
    provide: IdempotencyInterceptor,
    useFactory: (options: OncelyModuleOptions) => new IdempotencyInterceptor(options),
    inject: [ONCELY_OPTIONS],
  },
]
const exported = [ONCELY_OPTIONS, ONCELY_ENGINE, IdempotencyInterceptor]

/**
 * Provides the engine to the whole application (a global module) for `@Idempotent()` routes. Import it once, in the
 * root module. The store is checked when the application starts: without its table, `app.init()` and `app.listen()`
 * reject with a `StoreSetupError` naming the fix.
 *
 * @example
 * \@Module({ imports: [OncelyModule.forRoot({ engine, tenant: (request) => request.user.accountId })] })
 * class AppModule {}
 */
export class OncelyModule implements OnApplicationBootstrap {
  readonly #options: OncelyModuleOptions

  constructor(options: OncelyModuleOptions) {
    this.#options = options
  }

  /**
   * The module with options known when the module is declared. They are checked now, with a TypeError naming the
   * bad one.
   *
   * @example
   * OncelyModule.forRoot({ engine: createEngine({ store: postgresStore({ pool }) }), tenant: (req) => req.user.id })
   */
  static forRoot(options: OncelyModuleOptions): DynamicModule {
    checkModuleOptions(options)
    return {
      module: OncelyModule,
      global: true,
      providers: [{ provide: ONCELY_OPTIONS, useValue: options }, ...shared],
      exports: exported,
    }
  }

  /**
   * The module with options made by a factory from other providers (a pool, a configuration service). They are
   * checked when the application starts.
   *
   * @example
   * OncelyModule.forRootAsync({
   *   inject: [POOL],
   *   useFactory: (pool: pg.Pool) => ({ engine: createEngine({ store: postgresStore({ pool }) }), tenant }),
   * })
   */
  static forRootAsync(options: OncelyModuleAsyncOptions): DynamicModule {
    objectOptions('OncelyModule.forRootAsync()', options)
    requiredFunction('useFactory', options.useFactory, { of: 'OncelyModule.forRootAsync()' })
    return {
      module: OncelyModule,
      global: true,
      imports: options.imports ?? [],
      providers: [
        {
          provide: ONCELY_OPTIONS,
          useFactory: async (...args: unknown[]) => checkModuleOptions(await options.useFactory(...args)),
          inject: options.inject ?? [],
        },
        ...shared,
      ],
      exports: exported,
    }
  }

  /** Checks the store: a missing table fails the start-up; any other failure is logged (it may be passing). */
  async onApplicationBootstrap(): Promise<void> {
    try {
      await this.#options.engine.verify()
    } catch (error) {
      if (isStoreSetupError(error)) throw error
      ;(this.#options.logger ?? nestLogger()).error(
        { err: error },
        'oncely: could not check the idempotency store at start-up',
      )
    }
  }
}
Inject(ONCELY_OPTIONS)(OncelyModule, undefined, 0)
Module({})(OncelyModule)

/**
 * Makes a POST, PUT, PATCH or DELETE route handler idempotent: a request with an `Idempotency-Key` runs the handler
 * once, inside the transaction that also completes the key record (`@IdempotencyTx()`), and what Nest sends is held
 * until that commit; a retry gets the stored response with `Idempotent-Replayed: true`. An error the handler throws
 * is classified like any other (an `HttpException` by its status: a 4xx is stored and replayed, a 5xx releases the
 * key) and answered with the page your exception filters render. The options are checked now, with a TypeError
 * naming the bad one. On a GET, HEAD or OPTIONS request the handler does not run: the request gets a 500 problem
 * and the log says once per route to use it on unsafe methods only (safe methods are never idempotency-checked).
 *
 * @example
 * \@Post('payments')
 * \@Idempotent({ fingerprint: { exclude: ['clientTime'] } })
 * async create(@Body() body: { amount: number }, @IdempotencyTx() tx: pg.PoolClient) {
 *   const { rows } = await tx.query('INSERT INTO payments (amount) VALUES ($1) RETURNING id', [body.amount])
 *   return { id: rows[0].id }
 * }
 */
export function Idempotent(options?: IdempotencyRouteOptions): MethodDecorator {
  const route = resolveRoute(options, { of: '`@Idempotent()`' })
  return applyDecorators(SetMetadata(IDEMPOTENT_ROUTE, route), UseInterceptors(IdempotencyInterceptor))
}

const contextOf = (context: NestExecutionContext): ExecutionContext<unknown> | null =>
  context.switchToHttp().getRequest<WithIdempotency>().idempotency ?? null

/**
 * The business transaction of an `@Idempotent()` route, as your engine's datasource types it: do every write of the
 * request through it. Nest's parameter decorators cannot type the parameter, so name the type there: a
 * `pg.PoolClient` for a node-postgres pool, a Drizzle transaction, Kysely's `Transaction<DB>`, Knex's
 * `Knex.Transaction`, ... (the server README's table of datasources lists each). `null` on an optional route
 * (`required: false`) called without a key: type it `Transaction<DB> | null` there.
 *
 * @example
 * async create(@Body() body: Payment, @IdempotencyTx() tx: Transaction<DB>) {}
 */
export const IdempotencyTx: () => ParameterDecorator = createParamDecorator(
  (_data: unknown, context: NestExecutionContext) => contextOf(context)?.tx ?? null,
)

/**
 * The whole execution context of an `@Idempotent()` route: `tx`, `key`, `attempt`, `stepKey()`,
 * `saveRecoveryPoint()`, ... `null` on an optional route called without a key.
 *
 * @example
 * async create(@IdempotencyContext() idempotency: ExecutionContext<Transaction<DB>>) {
 *   await provider.charge({ idempotencyKey: idempotency.stepKey('charge') })
 * }
 */
export const IdempotencyContext: () => ParameterDecorator = createParamDecorator(
  (_data: unknown, context: NestExecutionContext) => contextOf(context),
)
