export type { ConsumeInput, ConsumeResult, Inbox, InboxOptions, MessageContext } from './inbox.js'
export { createInbox } from './inbox.js'
