export type { JetStreamConsumeOptions } from './consumer.js'
export { consumeJetStreamMessage } from './consumer.js'
export type { JetStreamPublisherOptions } from './publisher.js'
export { isNoStreamForSubjectError, jetStreamPublisher, NoStreamForSubjectError } from './publisher.js'
