; Runs tandem-lib.nsh's functions on fixed inputs and writes one line per case
; to functions-result.txt next to the .exe. Built and run (under Wine) by
; nsis_functions.sh, which compares the lines with the expected ones.
Unicode true
Target amd64-unicode
!ifndef OUTFILE
  !error "use nsis_functions.sh"
!endif
OutFile "${OUTFILE}"
RequestExecutionLevel user
SilentInstall silent

!include "LogicLib.nsh"
!addincludedir "${__FILEDIR__}\.."
!include "tandem-lib.nsh"
; (makensis warns that un.PathWithout is unused here; the installer uses it.)

Var Out

!macro USER in
  Push `${in}`
  Call LinuxUserName
  Pop $0
  FileWriteUTF16LE $Out `user|${in}|$0$\r$\n`
!macroend

!macro PATH path entry
  Push `${path}`
  Push `${entry}`
  Call PathWithout
  Pop $0
  FileWriteUTF16LE $Out `path|${path}|${entry}|$0$\r$\n`
!macroend

Section
  FileOpen $Out "$EXEDIR\functions-result.txt" w
  !insertmacro USER "JDoe"
  !insertmacro USER "Jöhn Doe-X"
  !insertmacro USER "maria.lopez"
  !insertmacro USER "李雷"
  !insertmacro USER "user_1"
  !insertmacro USER "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijkl"
  !insertmacro PATH "C:\foo;C:\T;C:\bar" "C:\T"
  !insertmacro PATH "C:\T" "C:\T"
  !insertmacro PATH "c:\t\;C:\foo" "C:\T"
  !insertmacro PATH "C:\foo;;C:\bar;" "C:\T"
  !insertmacro PATH "C:\foo;C:\T;C:\T\;C:\Tx" "C:\T"
  !insertmacro PATH "" "C:\T"
  !insertmacro PATH "%USERPROFILE%\bin;C:\T" "C:\T"
  FileClose $Out
SectionEnd
