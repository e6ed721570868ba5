// The checks every factory of @oncely/server runs on its options when it is called, so a mistake fails at start-up
// with a TypeError that names the bad option and what it must be, in the same words everywhere. No imports: the
// adapters and every layer can use it without loading anything else.

/** `value` as a JSON-ish literal for a message: strings quoted, everything else as `String()` gives it. */
function shown(value: unknown): string {
  return typeof value === 'string' ? JSON.stringify(value) : String(value)
}

/**
 * Where an option belongs and how to fix a mistake in it, for a message that would be ambiguous or bare without:
 * the last argument of every check.
 */
export interface OptionContext {
  /**
   * What the option is an option of, when its name alone does not say: an adapter (`'@oncely/server/koa'`), a
   * function (``'`idempotent()`'``) or a route (``'route `POST /x`'``).
   */
  of?: string
  /** A sentence that ends the message, saying what the option is for or how to fix it. */
  hint?: string
}

/** The option as a message names it: `` `leaseMs` ``, or `` `leaseMs` of `idempotent()` `` in a context. */
export function optionName(option: string, context?: OptionContext): string {
  return context?.of === undefined ? `\`${option}\`` : `\`${option}\` of ${context.of}`
}

/** The TypeError for `option` when it is not `what`; `got` shows the value for the checks whose values are short. */
function invalid(
  option: string,
  what: string,
  context: OptionContext | undefined,
  got?: { value: unknown },
): TypeError {
  const shownValue = got === undefined ? '' : `, got ${shown(got.value)}`
  const hint = context?.hint === undefined ? '' : ` ${context.hint}`
  return new TypeError(`Expected ${optionName(option, context)} to be ${what}${shownValue}.${hint}`)
}

/**
 * The options object given to `factory` (named with its parentheses: `'createInbox()'`), or a TypeError.
 *
 * @example
 * const { engine } = objectOptions('createInbox()', options)
 */
export function objectOptions<T>(
  factory: string,
  value: T,
  context?: Pick<OptionContext, 'hint'>,
): T & object {
  if (!isObject(value)) {
    const hint = context?.hint === undefined ? '' : ` ${context.hint}`
    throw new TypeError(`Expected the options of ${factory} to be an object.${hint}`)
  }
  return value
}

function isObject<T>(value: T): value is T & object {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

/** `value` when it is an object (an option whose members are options), or a TypeError naming `option`. */
export function objectOption<T>(option: string, value: T, context?: OptionContext): T & object {
  if (!isObject(value)) throw invalid(option, 'an object', context)
  return value
}

/**
 * `value` when it is an object, `flag` or `undefined`: an option that is switched on or off by a boolean and set up
 * by an object (`replayCache: false`, `idempotency: true`). A TypeError naming `option` for anything else.
 */
export function objectOrFlag<T, const F extends boolean>(
  option: string,
  value: T | F | undefined,
  flag: F,
  context?: OptionContext,
): (T & object) | F | undefined {
  if (value === undefined || value === flag || isObject(value)) return value as (T & object) | F | undefined
  throw invalid(option, `${flag} or an object`, context)
}

/**
 * Refuses the fault-injection switches of `@oncely/server/testing` when they reach a production factory, naming the
 * testing factory that takes them.
 */
export function refuseTestingOptions(
  factory: string,
  options: unknown,
  names: readonly string[],
  testingFactory: string,
): void {
  if (typeof options !== 'object' || options === null) return
  for (const name of names) {
    if (name in options) {
      throw new TypeError(
        `\`${name}\` is not an option of ${factory}: fault injection is for tests, through ${testingFactory} from '@oncely/server/testing'.`,
      )
    }
  }
}

/** `value` when it is a positive safe integer, or a TypeError naming `option`. */
export function positiveInteger(option: string, value: unknown, context?: OptionContext): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw invalid(option, 'a positive integer', context, { value })
  }
  return value
}

/** `value` when it is a string of at least one character, or a TypeError naming `option`. */
export function nonEmptyString(option: string, value: unknown, context?: OptionContext): string {
  if (typeof value !== 'string' || value === '') throw invalid(option, 'a non-empty string', context)
  return value
}

/** `value` when it is an array of strings, or a TypeError naming `option`. */
export function stringArray(option: string, value: unknown, context?: OptionContext): readonly string[] {
  if (!Array.isArray(value) || !value.every((item) => typeof item === 'string')) {
    throw invalid(option, 'an array of strings', context)
  }
  return value
}

// RFC 9110's token: what a header name may be.
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/

/** `value` when it is an array of header names (RFC 9110 tokens, in any case), or a TypeError naming `option`. */
export function headerNames(option: string, value: unknown, context?: OptionContext): readonly string[] {
  if (!Array.isArray(value) || !value.every((name) => typeof name === 'string' && TOKEN.test(name))) {
    throw invalid(option, "an array of header names, such as ['X-Request-Id']", context)
  }
  return value
}

/** `value` when it is a function, or a TypeError naming `option`. */
export function requiredFunction<F extends (...args: never[]) => unknown>(
  option: string,
  value: F | undefined,
  context?: OptionContext,
): F {
  if (typeof value !== 'function') throw invalid(option, 'a function', context)
  return value
}

/** `value` when it is a function or `undefined`, or a TypeError naming `option`. */
export function optionalFunction<F extends (...args: never[]) => unknown>(
  option: string,
  value: F | undefined,
  context?: OptionContext,
): F | undefined {
  return value === undefined ? undefined : requiredFunction(option, value, context)
}

/** `value`, or `fallback` when it is `undefined`; a TypeError naming `option` for anything but a boolean. */
export function optionalBoolean(
  option: string,
  value: unknown,
  fallback: boolean,
  context?: OptionContext,
): boolean {
  if (value === undefined) return fallback
  if (typeof value !== 'boolean') throw invalid(option, 'a boolean', context)
  return value
}

/** `value` when it is one of `allowed`, or a TypeError naming `option`, the allowed values and what it got. */
export function oneOf<const T extends string>(
  option: string,
  value: unknown,
  allowed: readonly T[],
  context?: OptionContext,
): T {
  if ((allowed as readonly unknown[]).includes(value)) return value as T
  const choices = allowed.map((choice) => `'${choice}'`)
  const list = choices.length > 1 ? `${choices.slice(0, -1).join(', ')} or ${choices.at(-1)}` : choices[0]
  throw invalid(option, list as string, context, { value })
}

/**
 * `value` when it has every one of `methods`, which is how a client of another library is recognised (a pg.Pool by
 * `connect` and `query`), or a TypeError naming `option` and saying what it must be (`what`: `'a pg.Pool'`).
 */
export function hasMethods<T>(
  option: string,
  value: T,
  methods: readonly string[],
  what: string,
  context?: OptionContext,
): T & object {
  if (
    (typeof value !== 'object' && typeof value !== 'function') ||
    value === null ||
    !methods.every((method) => typeof (value as Record<string, unknown>)[method] === 'function')
  ) {
    throw invalid(option, what, context)
  }
  return value
}

/**
 * `value` when it looks like an engine from `createEngine()` (or a wrapper of one: both have `execute` and
 * `verify`), or a TypeError naming `option`.
 */
export function engineOption<E extends { execute: unknown; verify: unknown }>(
  option: string,
  value: E | undefined,
  context?: OptionContext,
): E {
  if (typeof value?.execute !== 'function' || typeof value.verify !== 'function') {
    throw invalid(option, 'an engine from createEngine()', context)
  }
  return value
}

/**
 * `value` when it is `undefined` or a logger with pino's signature (`error(details, message)`, and `info` if it has
 * one), which `console` also has; a TypeError naming `option` for anything else.
 */
export function optionalLogger<L extends { error: unknown; info?: unknown }>(
  option: string,
  value: L | undefined,
  context?: OptionContext,
): L | undefined {
  if (value === undefined) return undefined
  if (
    typeof value !== 'object' ||
    value === null ||
    typeof value.error !== 'function' ||
    (value.info !== undefined && typeof value.info !== 'function')
  ) {
    throw invalid(option, "a logger with pino's `error(details, message)` method", context)
  }
  return value
}
