export type { ConsumeResult, MessageContext } from '../inbox/inbox.js'
export type { Jobs, JobsOptions, RunOnceInput } from './jobs.js'
export { createJobs } from './jobs.js'
