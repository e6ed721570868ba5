import { describe, expect, it } from 'vitest'
import { ConfigError, loadConfig } from '../src/config.js'
import { createFaults } from '../src/faults.js'

describe('loadConfig', () => {
  it('has the documented defaults', () => {
    expect(loadConfig({})).toEqual({
      port: 3000,
      host: '127.0.0.1',
      databaseUrl: undefined,
      pooler: 'none',
      poolSize: 20,
      distribution: 'none',
      providerDatabaseUrl: undefined,
      leaseMs: 30_000,
      retentionMs: 86_400_000,
      reservation: 'lock',
      replayCache: true,
      logLevel: 'info',
      provider: { delayMs: 0, failureRate: 0 },
      chaos: undefined,
    })
  })

  it.each([
    [{ PORT: 'http' }, /PORT must be an integer from 0 to 65535/],
    [{ PORT: '70000' }, /PORT/],
    [{ ONCELY_LEASE_MS: '0' }, /ONCELY_LEASE_MS/],
    [{ ONCELY_RETENTION_MS: '1.5' }, /ONCELY_RETENTION_MS/],
    [{ ONCELY_PROVIDER_FAILURE_RATE: '2' }, /ONCELY_PROVIDER_FAILURE_RATE must be a number from 0 to 1/],
    [{ DATABASE_URL: 'mysql://x' }, /DATABASE_URL must be a postgres/],
    [{ PROVIDER_DATABASE_URL: 'redis://x' }, /PROVIDER_DATABASE_URL must be a postgres/],
    [{ ONCELY_REPLAY_CACHE: 'off' }, /ONCELY_REPLAY_CACHE must be 1 or 0/],
    [{ DATABASE_POOLER: 'session' }, /DATABASE_POOLER must be none or transaction/],
    [{ DATABASE_POOL_SIZE: '0' }, /DATABASE_POOL_SIZE must be an integer from 1/],
    [{ DATABASE_DISTRIBUTION: 'cockroach' }, /DATABASE_DISTRIBUTION must be none or citus/],
    [{ ONCELY_RESERVATION: 'locks' }, /ONCELY_RESERVATION must be lock or row/],
    [{ ONCELY_CHAOS: 'yes' }, /ONCELY_CHAOS must be 1 or 0/],
    [{ ONCELY_CRASH_AT: 'after-provider' }, /ONCELY_CRASH_AT only has an effect with ONCELY_CHAOS=1/],
    [{ ONCELY_CHAOS: '1', ONCELY_CRASH_AT: 'after-lunch' }, /unknown point "after-lunch"/],
  ])('rejects %j, naming the variable', (env, message) => {
    expect(() => loadConfig(env)).toThrow(ConfigError)
    expect(() => loadConfig(env)).toThrow(message)
  })

  it('reads the reservation protocol', () => {
    expect(loadConfig({ ONCELY_RESERVATION: 'lock' }).reservation).toBe('lock')
    expect(loadConfig({ ONCELY_RESERVATION: 'row' }).reservation).toBe('row')
  })

  it('turns the replay cache off with ONCELY_REPLAY_CACHE=0', () => {
    expect(loadConfig({ ONCELY_REPLAY_CACHE: '0' }).replayCache).toBe(false)
    expect(loadConfig({ ONCELY_REPLAY_CACHE: '1' }).replayCache).toBe(true)
  })

  it("reads the pooler mode, the pool's size, and the provider's database (the API's own unless named)", () => {
    expect(loadConfig({ DATABASE_POOLER: 'transaction' }).pooler).toBe('transaction')
    expect(loadConfig({ DATABASE_POOL_SIZE: '5' }).poolSize).toBe(5)
    const url = 'postgres://127.0.0.1/app'
    expect(loadConfig({ DATABASE_URL: url }).providerDatabaseUrl).toBe(url)
    const provider = 'postgres://127.0.0.1/provider'
    expect(loadConfig({ DATABASE_URL: url, PROVIDER_DATABASE_URL: provider }).providerDatabaseUrl).toBe(
      provider,
    )
  })

  it('reads the chaos knobs only with ONCELY_CHAOS=1', () => {
    const config = loadConfig({
      ONCELY_CHAOS: '1',
      ONCELY_CRASH_AT: 'after-reserve, after-commit',
      ONCELY_CRASH_RATE: '0.25',
      ONCELY_DELAY_AT: 'before-commit',
      ONCELY_DELAY_MS: '50',
      ONCELY_CHAOS_SEED: '42',
      ONCELY_UNSAFE_DISABLE_FENCING: '1',
      ONCELY_UNSAFE_DISABLE_BACKSTOP: '1',
    })
    expect(config.chaos).toMatchObject({
      crashAt: new Set(['after-reserve', 'after-commit']),
      crashRate: 0.25,
      delayAt: new Set(['before-commit']),
      delayMs: 50,
      delayRate: 1,
      seed: 42,
      disableFencing: true,
      disableBackstop: true,
      disableIdempotency: false,
    })
  })
})

describe('createFaults', () => {
  it('does nothing without chaos', async () => {
    let killed = 0
    await createFaults(undefined, { kill: () => killed++, report: () => {} }).at('after-provider')
    expect(killed).toBe(0)
  })

  it('crashes only at the configured points, and a seed reproduces which draws crash', async () => {
    const chaos = loadConfig({
      ONCELY_CHAOS: '1',
      ONCELY_CRASH_AT: 'after-provider',
      ONCELY_CRASH_RATE: '0.5',
      ONCELY_CHAOS_SEED: '7',
    }).chaos
    const run = async () => {
      const crashes: number[] = []
      let i = 0
      const faults = createFaults(chaos, { kill: () => crashes.push(i), report: () => {} })
      for (i = 0; i < 40; i++) {
        await faults.at('after-reserve')
        await faults.at('after-provider')
      }
      return crashes
    }
    const first = await run()
    expect(first.length).toBeGreaterThan(5)
    expect(first.length).toBeLessThan(35)
    expect(await run()).toEqual(first)
  })
})
