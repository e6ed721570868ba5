/**
 * Checks an options object and collects every problem, so that one `TypeError` names all the bad options at once
 * rather than the first only. Each check returns the value to use (its default when the option is absent, and
 * still the default when it is invalid, so checking can go on).
 */
export class OptionChecks {
  readonly #problems: string[] = []

  /**
   * `what` names the options object in the error, such as `createClient` or `fileStore`; `options` must be an
   * object (else this throws at once).
   */
  constructor(
    readonly what: string,
    options: unknown,
  ) {
    if (typeof options !== 'object' || options === null)
      throw new TypeError(`${what}: Expected an options object`)
  }

  /** Records a problem; `message` must name the option, such as "Expected `leaseMs` to be ...". */
  problem(message: string): void {
    this.#problems.push(message)
  }

  /** A number of at least `min` (an integer when asked), or `fallback` when absent. */
  number(name: string, value: unknown, fallback: number, min: number, integer = false): number {
    if (value === undefined) return fallback
    if (typeof value !== 'number' || Number.isNaN(value) || value < min) {
      this.problem(`Expected \`${name}\` to be a number >= ${min}, got ${String(value)}`)
      return fallback
    }
    if (integer && !Number.isInteger(value)) {
      this.problem(`Expected \`${name}\` to be an integer, got ${value}`)
      return fallback
    }
    return value
  }

  /** One of `allowed`, or `fallback` when absent. */
  oneOf<T extends string>(name: string, value: unknown, allowed: readonly T[], fallback: T): T {
    if (value === undefined) return fallback
    if (!allowed.includes(value as T)) {
      this.problem(
        `Expected \`${name}\` to be ${allowed.map((a) => `'${a}'`).join(' or ')}, got ${String(value)}`,
      )
      return fallback
    }
    return value as T
  }

  /** A function, when present. */
  fn(name: string, value: unknown): void {
    if (value !== undefined && typeof value !== 'function')
      this.problem(`Expected \`${name}\` to be a function`)
  }

  /** A boolean, when present. */
  boolean(name: string, value: unknown): void {
    if (value !== undefined && typeof value !== 'boolean')
      this.problem(`Expected \`${name}\` to be a boolean, got ${String(value)}`)
  }

  /** A string of at least one character, when present. */
  nonEmptyString(name: string, value: unknown): void {
    if (value !== undefined && (typeof value !== 'string' || value === ''))
      this.problem(`Expected \`${name}\` to be a non-empty string, got ${String(value)}`)
  }

  /** Throws one `TypeError` naming every problem recorded, if there is any. */
  done(): void {
    const problems = this.#problems
    if (problems.length === 1) throw new TypeError(`${this.what}: ${problems[0]}`)
    if (problems.length > 1) {
      throw new TypeError(`${this.what}: ${problems.length} invalid options: ${problems.join('; ')}`)
    }
  }
}
