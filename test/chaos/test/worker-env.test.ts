import { describe, expect, it } from 'vitest'
import { workerEnv } from '../src/worker-env.js'

const base = {
  ONCELY_CHAOS_WORKER_NAME: 'worker-1',
  ONCELY_CHAOS_BASE_URL: 'http://127.0.0.1:4000',
  ONCELY_CHAOS_TENANT: 'tenant-1',
  ONCELY_CHAOS_STORE_DIR: '/tmp/store',
}

describe('workerEnv', () => {
  it('reads the worker environment with its defaults', () => {
    expect(workerEnv(base)).toEqual({
      name: 'worker-1',
      baseUrl: 'http://127.0.0.1:4000',
      tenant: 'tenant-1',
      storeDir: '/tmp/store',
      timeoutMs: 2000,
      seed: 0,
      crashAt: new Set(),
      crashRate: 0.05,
    })
    const armed = workerEnv({
      ...base,
      ONCELY_CHAOS_WORKER_CRASH_AT: 'after-send',
      ONCELY_CHAOS_WORKER_CRASH_RATE: '1',
    })
    expect([...armed.crashAt]).toEqual(['after-send'])
    expect(armed.crashRate).toBe(1)
  })

  it('rejects a missing variable, an unknown step and a non-loopback URL, naming the variable', () => {
    expect(() => workerEnv({ ...base, ONCELY_CHAOS_TENANT: '' })).toThrow(/`ONCELY_CHAOS_TENANT`/)
    expect(() => workerEnv({ ...base, ONCELY_CHAOS_WORKER_CRASH_AT: 'after-lunch' })).toThrow(
      /Unknown step `after-lunch`/,
    )
    expect(() => workerEnv({ ...base, ONCELY_CHAOS_BASE_URL: 'http://example.com' })).toThrow(
      /`ONCELY_CHAOS_BASE_URL`/,
    )
    expect(() => workerEnv({ ...base, ONCELY_CHAOS_TIMEOUT_MS: '-5' })).toThrow(/`ONCELY_CHAOS_TIMEOUT_MS`/)
  })
})
