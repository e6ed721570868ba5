// The checks every factory of @oncely/server runs on its options when it is called, so a mistake fails at start-up
// with a TypeError that names the bad option and what it must be, in the same words everywhere. No imports: the
// adapters and every layer can use it without loading anything else.

/** `value` as a JSON-ish literal for a message: strings quoted, everything else as `String()` gives it. */
function shown(value: unknown): string {
  return typeof value === 'string' ? JSON.stringify(value) : String(value)
}

/**
 * The options object given to `factory` (named with its parentheses: `'createInbox()'`), or a TypeError.
 *
 * @example
 * const { engine } = objectOptions('createInbox()', options)
 */
export function objectOptions<T>(factory: string, value: T): T & object {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new TypeError(`Expected the options of ${factory} to be an object.`)
  }
  return value
}

/** `value` when it is an object (an option whose members are options), or a TypeError naming `option`. */
export function objectOption<T>(option: string, value: T): T & object {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new TypeError(`Expected \`${option}\` to be an object.`)
  }
  return value
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
export function positiveInteger(option: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw new TypeError(`Expected \`${option}\` to be a positive integer, got ${shown(value)}.`)
  }
  return value
}

/** `value` when it is a string of at least one character, or a TypeError naming `option`. */
export function nonEmptyString(option: string, value: unknown): string {
  if (typeof value !== 'string' || value === '') {
    throw new TypeError(`Expected \`${option}\` to be a non-empty string.`)
  }
  return value
}

/** `value` when it is a function, or a TypeError naming `option`. */
export function requiredFunction<F extends (...args: never[]) => unknown>(
  option: string,
  value: F | undefined,
): F {
  if (typeof value !== 'function') throw new TypeError(`Expected \`${option}\` to be a function.`)
  return value
}

/** `value` when it is a function or `undefined`, or a TypeError naming `option`. */
export function optionalFunction<F extends (...args: never[]) => unknown>(
  option: string,
  value: F | undefined,
): F | undefined {
  return value === undefined ? undefined : requiredFunction(option, value)
}

/** `value`, or `fallback` when it is `undefined`; a TypeError naming `option` for anything but a boolean. */
export function optionalBoolean(option: string, value: unknown, fallback: boolean): boolean {
  if (value === undefined) return fallback
  if (typeof value !== 'boolean') throw new TypeError(`Expected \`${option}\` to be a boolean.`)
  return value
}

/** `value` when it is one of `allowed`, or a TypeError naming `option`, the allowed values and what it got. */
export function oneOf<const T extends string>(option: string, value: unknown, allowed: readonly T[]): T {
  if ((allowed as readonly unknown[]).includes(value)) return value as T
  const choices = allowed.map((choice) => `'${choice}'`)
  const list = choices.length > 1 ? `${choices.slice(0, -1).join(', ')} or ${choices.at(-1)}` : choices[0]
  throw new TypeError(`Expected \`${option}\` to be ${list}, got ${shown(value)}.`)
}

/** `value` when it looks like an engine from `createEngine()` (or a wrapper of one), or a TypeError naming `option`. */
export function engineOption<E extends { execute: unknown }>(option: string, value: E | undefined): E {
  if (typeof value?.execute !== 'function') {
    throw new TypeError(`Expected \`${option}\` to be an engine from createEngine().`)
  }
  return value
}
