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
export interface StandaloneAdapter<Request, Args extends unknown[]> {
  tenant: StandaloneAdapterOptions<Request, Args>['tenant']
  log: AdapterLogger
  core: HttpCore
  policy: RequestPolicy
}

/** Checks an adapter's options (a TypeError names the bad one) and builds its core and its request policy. */
export function standaloneAdapter<Request, Args extends unknown[] = []>(
  options: StandaloneAdapterOptions<Request, Args>,
  adapter: string,
): StandaloneAdapter<Request, Args> {
  checkAdapterOptions(options as AdapterOptions<never, never>, adapter)
  return {
    tenant: options.tenant,
    log: options.logger ?? consoleLogger,
    core: createHttpCore(options.engine, adapter),
    policy: createRequestPolicy(adapter),
  }
}
