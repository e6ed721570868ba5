// React Native cannot be installed in Node (native toolchains, Hermes), so the examples that import it compile
// against these declarations: the parts of the real APIs the examples use, with the same names and signatures.

declare module 'react-native' {
  import type { ComponentType, ReactNode } from 'react'

  export type AppStateStatus = 'active' | 'background' | 'inactive' | 'unknown' | 'extension'
  export const AppState: {
    currentState: AppStateStatus
    addEventListener(type: 'change', listener: (state: AppStateStatus) => void): { remove(): void }
  }
  export const View: ComponentType<{ children?: ReactNode }>
  export const Text: ComponentType<{ children?: ReactNode }>
  export const Button: ComponentType<{ title: string; onPress: () => void; disabled?: boolean }>
}

declare module '@react-native-async-storage/async-storage' {
  const AsyncStorage: {
    getItem(key: string): Promise<string | null>
    setItem(key: string, value: string): Promise<void>
    removeItem(key: string): Promise<void>
    getAllKeys(): Promise<readonly string[]>
  }
  export default AsyncStorage
}
