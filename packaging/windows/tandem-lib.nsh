; Helpers for tandem.nsi in plain NSIS (no plugins beyond Debian's nsis).
; Kept apart so test/nsis_functions.sh can compile and run them on their own.
; Needs LogicLib.nsh.

; LinuxUserName: stack in: a Windows user name. Stack out: a Linux user name:
; lowercased, every character outside [a-z0-9_-] dropped (which also makes it
; safe on wsl.exe's command line), at most 32 characters, "tandem" if nothing
; is left. wsl-setup.sh applies useradd's remaining rules (first character a
; letter or "_", no system account) and falls back to "tandem" itself.
Function LinuxUserName
  Exch $0        ; raw name
  Push $1        ; result
  Push $2        ; index into $0
  Push $3        ; character of $0
  Push $4        ; index into the allowed characters
  Push $5        ; allowed character
  StrCpy $1 ""
  StrCpy $2 0
  ${Do}
    StrCpy $3 $0 1 $2
    ${If} $3 == ""
      ${Break}
    ${EndIf}
    StrCpy $4 0
    ${Do}
      StrCpy $5 "abcdefghijklmnopqrstuvwxyz0123456789_-" 1 $4
      ${If} $5 == ""
        ${Break}              ; not allowed: dropped
      ${EndIf}
      ; StrCmp (==) ignores case, so "A" matches "a" and the lowercase is kept.
      ${If} $3 == $5
        StrCpy $1 "$1$5"
        ${Break}
      ${EndIf}
      IntOp $4 $4 + 1
    ${Loop}
    IntOp $2 $2 + 1
  ${Loop}
  StrCpy $1 $1 32
  ${If} $1 == ""
    StrCpy $1 "tandem"
  ${EndIf}
  StrCpy $0 $1
  Pop $5
  Pop $4
  Pop $3
  Pop $2
  Pop $1
  Exch $0
FunctionEnd

; PathWithout: stack in: PATH, entry (top). Stack out: PATH with every
; ";"-separated element equal to entry (case-insensitive, a trailing "\"
; ignored) removed. Everything else is kept as it was, empty elements included,
; so "result == PATH" means "entry is not in PATH".
!macro DEFINE_PATH_WITHOUT prefix
Function ${prefix}PathWithout
  Exch $1        ; entry
  Exch
  Exch $0        ; path
  Push $2        ; result
  Push $3        ; current element
  Push $4        ; scratch
  Push $5        ; character at the end of the element ("" = end of PATH)
  Push $6        ; "1" once an element went into the result
  StrCpy $2 ""
  StrCpy $6 "0"
  ${Do}
    ; $3 = next element, $0 = the rest after its ";"
    StrCpy $4 0
    ${Do}
      StrCpy $5 $0 1 $4
      ${If} $5 == ";"
      ${OrIf} $5 == ""
        ${Break}
      ${EndIf}
      IntOp $4 $4 + 1
    ${Loop}
    StrCpy $3 $0 $4
    IntOp $4 $4 + 1
    StrCpy $0 $0 "" $4
    ; compare without a trailing backslash
    StrCpy $4 $3 1 -1
    ${If} $4 == "\"
      StrCpy $4 $3 -1
    ${Else}
      StrCpy $4 $3
    ${EndIf}
    ${If} $3 == ""
    ${OrIf} $4 != $1
      ${If} $6 == "1"
        StrCpy $2 "$2;$3"
      ${Else}
        StrCpy $2 $3
        StrCpy $6 "1"
      ${EndIf}
    ${EndIf}
    ${If} $5 == ""
      ${Break}
    ${EndIf}
  ${Loop}
  ; Restore $6..$1 and $0 and leave the result on the stack. The stack is
  ; now (top first) old $6, $5, $4, $3, $2, old $0, old $1.
  Pop $6
  Pop $5
  Pop $4
  Pop $3
  StrCpy $0 $2   ; result
  Pop $2
  Exch           ; old $1, old $0
  Pop $1
  Exch $0        ; $0 = old $0, result on top
FunctionEnd
!macroend
!insertmacro DEFINE_PATH_WITHOUT ""
!insertmacro DEFINE_PATH_WITHOUT "un."
