from imagegate.cli import main

main()
