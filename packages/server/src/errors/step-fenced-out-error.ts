import { nameOf, OncelyServerError } from './oncely-server-error.js'

/** The engine fenced out this attempt (another took over the key): its step was rolled back. */
export class StepFencedOutError extends OncelyServerError {
  override name = 'StepFencedOutError' as const
  /** The step whose writes were rolled back. */
  readonly step: string
  constructor(step: string) {
    super(`Another attempt took over this key; step "${step}" was rolled back.`)
    this.step = step
  }
}

/** True for a {@link StepFencedOutError}, also across bundles. */
export function isStepFencedOutError(error: unknown): error is StepFencedOutError {
  return error instanceof StepFencedOutError || nameOf(error) === 'StepFencedOutError'
}
