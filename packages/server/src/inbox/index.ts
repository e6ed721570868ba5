export type {
  ConsumeInput,
  ConsumeResult,
  Inbox,
  InboxEvent,
  InboxOptions,
  MessageContext,
} from './inbox.js'
export { createInbox, describeInboxEvent } from './inbox.js'
