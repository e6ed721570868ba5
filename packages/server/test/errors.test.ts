import { readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import {
  isOncelyServerError,
  isResponseTooLargeError,
  isStoreSetupError,
  OncelyServerError,
  ResponseTooLargeError,
  StoreSetupError,
} from '../src/index.js'
import { isNoStreamForSubjectError, NoStreamForSubjectError } from '../src/nats/index.js'
import { isRedisTimeoutError, RedisTimeoutError } from '../src/redis/index.js'
import { isStepFencedOutError, StepFencedOutError } from '../src/steps/index.js'

// Every error the package throws at its users, with its own guard.
const errors: Array<[Error, (error: unknown) => boolean]> = [
  [new ResponseTooLargeError(2_000_000, 1_000_000), isResponseTooLargeError],
  [new StoreSetupError('run migrate()', '42P01', new Error('relation does not exist')), isStoreSetupError],
  [new StepFencedOutError('charge'), isStepFencedOutError],
  [new NoStreamForSubjectError('orders.created'), isNoStreamForSubjectError],
  [new RedisTimeoutError(250), isRedisTimeoutError],
]

describe('the server errors', () => {
  it.each(errors)('%s is an OncelyServerError, told apart by its own guard', (error, guard) => {
    expect(error).toBeInstanceOf(OncelyServerError)
    expect(error).toBeInstanceOf(Error)
    expect(isOncelyServerError(error)).toBe(true)
    expect(guard(error)).toBe(true)
    // Another copy of the package (two bundles): the same name, not the same class.
    const copy = Object.assign(new Error(error.message), { name: error.name })
    expect(guard(copy)).toBe(true)
    expect(isOncelyServerError(copy)).toBe(true)
    for (const [other, otherGuard] of errors) if (other !== error) expect(otherGuard(error)).toBe(false)
  })

  it("keeps the application's and the driver's errors apart", () => {
    const pgError = Object.assign(new Error('duplicate key value'), { code: '23505' })
    for (const error of [
      new Error('declined'),
      pgError,
      new TypeError('x'),
      null,
      undefined,
      'text',
      { name: 1 },
    ])
      expect(isOncelyServerError(error)).toBe(false)
  })

  it('says what was rolled back and where', () => {
    expect(new StepFencedOutError('charge').step).toBe('charge')
    expect(new NoStreamForSubjectError('orders.created').subject).toBe('orders.created')
    expect(new RedisTimeoutError(250).timeoutMs).toBe(250)
  })

  it('exports no error class from any entry point without the base class and its guard', async () => {
    const manifest = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as {
      exports: Record<string, { '@oncely/source'?: string }>
    }
    const found: string[] = []
    for (const [entry, conditions] of Object.entries(manifest.exports)) {
      const source = conditions['@oncely/source']
      if (source === undefined) continue
      const module = (await import(new URL(`../${source}`, import.meta.url).href)) as Record<string, unknown>
      for (const [name, value] of Object.entries(module)) {
        if (typeof value !== 'function' || !(value.prototype instanceof Error)) continue
        if (value === OncelyServerError) continue
        found.push(name)
        expect(value.prototype, `${entry} ${name}`).toBeInstanceOf(OncelyServerError)
        expect(typeof module[`is${name}`], `${entry} is${name}`).toBe('function')
      }
    }
    // Each one is in the list above too, so the guards' checks cover a new class as well.
    expect(new Set(found)).toEqual(new Set(errors.map(([error]) => error.name)))
  })
})
