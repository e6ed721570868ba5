export { useOncelyClient } from './context.js'
export type { IntentMutationState, MutateOptions, MutationDefinition } from './intent-mutation.js'
export type { PendingIntentsView, UsePendingIntentsOptions } from './pending-intents.js'
export { usePendingIntents } from './pending-intents.js'
export type { OncelyProviderProps } from './provider.js'
export { OncelyProvider } from './provider.js'
export type {
  InvalidatingQueryClient,
  OncelyMutationOptions,
  OncelyMutationOptionsInput,
  ResumingQueryClient,
} from './tanstack-query.js'
export { oncelyMutationOptions, useInvalidateOnResumed, useResumedMutations } from './tanstack-query.js'
export type { UseOnResumedOptions } from './use-on-resumed.js'
export { useOnResumed } from './use-on-resumed.js'
export type { UseOncelyMutationOptions, UseOncelyMutationResult } from './use-oncely-mutation.js'
export { useOncelyMutation } from './use-oncely-mutation.js'
