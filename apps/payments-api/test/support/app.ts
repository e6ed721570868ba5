import { randomUUID } from 'node:crypto'
import type { FastifyInstance, LightMyRequestResponse } from 'fastify'
import type pg from 'pg'
import type { ChaosConfig } from '../../src/config.js'
import type { Provider } from '../../src/provider.js'

/** A provider randomness source that replays queued draws, then never fails (draws 0.99). */
export function queuedRandom(): { random: () => number; queue: number[] } {
  const queue: number[] = []
  return { queue, random: () => queue.shift() ?? 0.99 }
}

/** POSTs a payment as `tenant` with `key` (a fresh one by default). */
export function pay(
  app: FastifyInstance,
  body: unknown,
  { tenant = 'acme', key = randomUUID() }: { tenant?: string; key?: string } = {},
): Promise<LightMyRequestResponse> {
  return app.inject({
    method: 'POST',
    url: '/v1/payments',
    headers: {
      authorization: `Bearer ${tenant}`,
      'idempotency-key': key,
      'content-type': 'application/json',
    },
    payload: typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body),
  })
}

/** Counts rows of a table, optionally filtered by one column. */
export async function count(
  pool: pg.Pool,
  table: string,
  where?: [column: string, value: unknown],
): Promise<number> {
  const { rows } = await pool.query<{ n: string }>(
    `SELECT count(*) AS n FROM ${table}${where ? ` WHERE ${where[0]} = $1` : ''}`,
    where ? [where[1]] : [],
  )
  return Number(rows[0]!.n)
}

/** Wraps a provider to count `charge` calls per step key (charges taken are in `provider_charges`). */
export function countingProvider(provider: Provider): Provider & { calls: Map<string, number> } {
  const calls = new Map<string, number>()
  return {
    calls,
    charge: (request) => {
      calls.set(request.stepKey, (calls.get(request.stepKey) ?? 0) + 1)
      return provider.charge(request)
    },
    countCharges: (filter) => provider.countCharges(filter),
  }
}

/** The recovery point `steps()` saved on a key, parsed, or null. */
export async function recoveryPoint(
  pool: pg.Pool,
  tenant: string,
  key: string,
): Promise<{ step: string; state: Record<string, unknown> } | null> {
  const { rows } = await pool.query<{ recovery_point: string | null }>(
    'SELECT recovery_point FROM oncely.idempotency_keys WHERE scope = $1 AND key = $2',
    [tenant, key],
  )
  return rows[0]?.recovery_point ? JSON.parse(rows[0].recovery_point) : null
}

/** A chaos configuration with no fault armed and every safety on, except what `unsafe` turns off. */
export function chaosConfig(
  unsafe: Partial<Pick<ChaosConfig, 'disableIdempotency' | 'disableFencing' | 'disableBackstop'>>,
): ChaosConfig {
  return {
    crashAt: new Set(),
    crashRate: 1,
    delayAt: new Set(),
    delayMs: 0,
    delayRate: 1,
    seed: undefined,
    disableIdempotency: false,
    disableFencing: false,
    disableBackstop: false,
    ...unsafe,
  }
}
