export type { Jobs, JobsOptions, RunOnceInput } from './jobs.js'
export { createJobs } from './jobs.js'
