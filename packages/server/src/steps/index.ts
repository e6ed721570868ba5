export type { AbandonedIntent, Completer, CompleterOptions, StoredRequest } from './completer.js'
export { createCompleter } from './completer.js'
export type { RecoveryPoint, Step, StepContext, StepsOptions } from './steps.js'
export { isStepFencedOutError, parseRecoveryPoint, StepFencedOutError, steps } from './steps.js'
