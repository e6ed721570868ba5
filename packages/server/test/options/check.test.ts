import { describe, expect, it } from 'vitest'
import {
  engineOption,
  headerNames,
  objectOption,
  objectOptions,
  objectOrFlag,
  oneOf,
  optionalBoolean,
  optionalLogger,
  positiveInteger,
  requiredFunction,
  stringArray,
} from '../../src/options/check.js'

// Every factory words a bad option through these, so the words are held once here; the factories' own tests show
// that each names its options.
describe('the option checks', () => {
  it('name the option, what it is an option of, and end with the hint', () => {
    expect(() => positiveInteger('leaseMs', 0)).toThrow('Expected `leaseMs` to be a positive integer, got 0.')
    expect(() => positiveInteger('leaseMs', '5', { of: '`idempotent()`' })).toThrow(
      'Expected `leaseMs` of `idempotent()` to be a positive integer, got "5".',
    )
    expect(() =>
      requiredFunction('tenant', 't' as never, {
        of: '@oncely/server/koa',
        hint: 'It returns the tenant id.',
      }),
    ).toThrow('Expected `tenant` of @oncely/server/koa to be a function. It returns the tenant id.')
    expect(() => oneOf('reservation', 'x', ['row', 'lock'], { of: 'createEngine()' })).toThrow(
      "Expected `reservation` of createEngine() to be 'row' or 'lock', got \"x\".",
    )
    expect(() => optionalBoolean('query', 1, false)).toThrow('Expected `query` to be a boolean.')
    expect(() => objectOptions('corsHeaders()', [], { hint: 'It takes `allowedHeaders`.' })).toThrow(
      'Expected the options of corsHeaders() to be an object. It takes `allowedHeaders`.',
    )
    expect(() => objectOption('wait', null)).toThrow('Expected `wait` to be an object.')
  })

  it('take an object or the flag that switches the option', () => {
    expect(objectOrFlag('replayCache', false, false)).toBe(false)
    expect(objectOrFlag('replayCache', undefined, false)).toBeUndefined()
    expect(objectOrFlag('idempotency', true, true)).toBe(true)
    expect(() => objectOrFlag('replayCache', true as never, false)).toThrow(
      'Expected `replayCache` to be false or an object.',
    )
    expect(() => objectOrFlag('idempotency', 'yes' as never, true)).toThrow(
      'Expected `idempotency` to be true or an object.',
    )
  })

  it('check arrays of strings and of header names', () => {
    expect(stringArray('include', ['amount'])).toEqual(['amount'])
    expect(() => stringArray('include', 'amount')).toThrow('Expected `include` to be an array of strings.')
    expect(headerNames('allowedHeaders', ['Authorization'])).toEqual(['Authorization'])
    for (const bad of ['Authorization', ['Not a header'], [1], ['']]) {
      expect(() => headerNames('allowedHeaders', bad)).toThrow(
        "Expected `allowedHeaders` to be an array of header names, such as ['X-Request-Id'].",
      )
    }
  })

  it('check engines and loggers by their methods', () => {
    const engine = { execute: async () => ({}), verify: async () => {} }
    expect(engineOption('engine', engine)).toBe(engine)
    expect(() => engineOption('engine', { execute: async () => ({}) } as never)).toThrow(
      'Expected `engine` to be an engine from createEngine().',
    )
    expect(optionalLogger('logger', undefined)).toBeUndefined()
    expect(optionalLogger('logger', console)).toBe(console)
    expect(() => optionalLogger('logger', { error: () => {}, info: 'x' } as never)).toThrow(
      "Expected `logger` to be a logger with pino's `error(details, message)` method.",
    )
  })
})
