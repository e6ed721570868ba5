import { useInsertionEffect, useRef } from 'react'

/**
 * A ref that holds the latest committed `value`, for callbacks that run after render (event handlers, client events)
 * and must see the latest props without resubscribing. Written in an insertion effect, never during render, so a
 * render that React discards (concurrent rendering, StrictMode) cannot leak into it.
 */
export function useLatest<T>(value: T): { readonly current: T } {
  const ref = useRef(value)
  useInsertionEffect(() => {
    ref.current = value
  })
  return ref
}
