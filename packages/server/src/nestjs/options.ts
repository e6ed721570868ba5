import type { ExecutionContext as NestExecutionContext } from '@nestjs/common'
import { Logger } from '@nestjs/common'
import type { AdapterLogger, StandaloneAdapterOptions } from '../http/options.js'
import { checkAdapterOptions } from '../http/options.js'

export const ADAPTER = '@oncely/server/nestjs'

/**
 * The injection token of the {@link OncelyModuleOptions} that `OncelyModule.forRoot()` or `forRootAsync()`
 * provides (globally).
 */
export const ONCELY_OPTIONS: unique symbol = Symbol('oncely.options')

/** The injection token of the engine that `OncelyModule` provides (globally), to inject it where it is needed. */
export const ONCELY_ENGINE: unique symbol = Symbol('oncely.engine')

/**
 * Options of `OncelyModule.forRoot()`: the engine, how to find the tenant of a request, and the logger.
 * `tenant` gets the platform's request (Express's `Request` or Fastify's `FastifyRequest`, after your guards ran)
 * and Nest's execution context. The engine may be over any datasource: Nest's parameter decorators cannot carry its
 * transaction type, so a handler names it where it takes `@IdempotencyTx() tx: Transaction<DB>`.
 *
 * @example
 * OncelyModule.forRoot({ engine, tenant: (request: { user: { accountId: string } }) => request.user.accountId })
 */
// biome-ignore lint/suspicious/noExplicitAny: the platform's request, typed by the app's `tenant` function
export interface OncelyModuleOptions<Request = any>
  extends StandaloneAdapterOptions<Request, [context: NestExecutionContext], unknown> {}

/** Options of `OncelyModule.forRootAsync()`: the options made by a factory, with Nest's dependency injection. */
export interface OncelyModuleAsyncOptions {
  /**
   * Modules whose providers the factory injects.
   * @default []
   * @example
   * imports: [DatabaseModule]
   */
  // biome-ignore lint/suspicious/noExplicitAny: Nest's own type for `imports` (classes, dynamic modules, promises)
  imports?: any[]
  /**
   * The tokens of the providers passed to `useFactory`, in order.
   * @default []
   * @example
   * inject: [DATABASE_POOL]
   */
  // biome-ignore lint/suspicious/noExplicitAny: Nest's injection tokens (classes, strings, symbols)
  inject?: any[]
  /**
   * Makes the options, once per application, at start-up.
   * @example
   * useFactory: (pool: pg.Pool) => ({ engine: createEngine({ store: postgresStore({ pool }) }), tenant })
   */
  // biome-ignore lint/suspicious/noExplicitAny: the providers named by `inject`
  useFactory: (...args: any[]) => OncelyModuleOptions | Promise<OncelyModuleOptions>
}

/** Validates the module's options at start-up, naming the bad one. */
export function checkModuleOptions(options: OncelyModuleOptions): OncelyModuleOptions {
  checkAdapterOptions(options, ADAPTER, "Pass pino, or Nest's logger through it.")
  return options
}

/** The default logger: Nest's own, under the `oncely` context; errors only. */
export function nestLogger(): AdapterLogger {
  const logger = new Logger('oncely')
  return {
    error: (details, message) => {
      const fields = Object.entries(details)
        .map(([name, value]) => `${name}=${value instanceof Error ? value.message : JSON.stringify(value)}`)
        .join(' ')
      logger.error(fields ? `${message} (${fields})` : message)
    },
  }
}
