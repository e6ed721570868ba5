import type pg from 'pg'
import { createHttpCore, type HttpCore } from './core.js'
import {
  type AdapterLogger,
  type AdapterOptions,
  checkAdapterOptions,
  consoleLogger,
  type StandaloneAdapterOptions,
} from './options.js'
import { createRequestPolicy, type RequestPolicy } from './policy.js'

/** What an adapter that is not a plugin of its framework builds once, from its options (checked here). */
export interface StandaloneAdapter<Request, Args extends unknown[], Tx = pg.PoolClient> {
  tenant: StandaloneAdapterOptions<Request, Args, Tx>['tenant']
  log: AdapterLogger
  core: HttpCore<Tx>
  policy: RequestPolicy
}

/** Checks an adapter's options (a TypeError names the bad one) and builds its core and its request policy. */
export function standaloneAdapter<Request, Args extends unknown[] = [], Tx = pg.PoolClient>(
  options: StandaloneAdapterOptions<Request, Args, Tx>,
  adapter: string,
): StandaloneAdapter<Request, Args, Tx> {
  checkAdapterOptions(options as unknown as AdapterOptions<never, never, unknown>, adapter)
  return {
    tenant: options.tenant,
    log: options.logger ?? consoleLogger,
    core: createHttpCore(options.engine, adapter),
    policy: createRequestPolicy(adapter),
  }
}
